//! `kv.cross` in a config: the static cross-attention K/V are in the region and on their own
//! budget line (configs/whisper-tiny.yaml).

use htpkv::budget::report;
use htpkv::config::Config;
use htpkv::kv_manager::Strategy;
use std::path::Path;

const WHISPER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/whisper-tiny.yaml");

#[test]
fn static_cross_kv_is_counted_in_the_region_of_every_strategy() {
    let config = Config::load(WHISPER).unwrap();
    let mut plain = config.clone();
    plain.kv.cross = None;
    for update in [
        Strategy::SHIFT_2X,
        Strategy::Conveyor,
        Strategy::SmartMask,
        Strategy::Naive,
    ] {
        let with = report(&config, update, 0).unwrap();
        let without = report(&plain, update, 0).unwrap();
        // 4 layers x 6 heads x 2 buffers x 1500 rows x 64 B.
        assert_eq!(with.cross_bytes, 48 * 1500 * 64);
        assert_eq!(without.cross_bytes, 0);
        let gap = with.region_bytes - without.region_bytes - with.cross_bytes;
        assert!(gap < kv_manager::CROSS_ALIGN, "{update:?}: gap {gap}");
        assert_eq!(with.region_rows, without.region_rows);
        assert_eq!(
            with.total_bytes - without.total_bytes,
            with.region_bytes - without.region_bytes
        );
    }
}

#[test]
fn a_bad_cross_section_names_its_field() {
    let text = std::fs::read_to_string(WHISPER).unwrap();
    let zero = text.replace("rows: 1500", "rows: 0");
    let err = Config::from_yaml(&zero, Path::new("w.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("kv.cross") && err.contains("rows"), "{err}");
    let typo = text.replace("rows: 1500", "frames: 1500");
    let err = Config::from_yaml(&typo, Path::new("w.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("frames"), "{err}");
}
