//! Fuzz the frame parser: any input, contiguous or split into segments, must yield a result or
//! an error and never panic; whatever parses must re-emit to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::wire::frame;

fuzz_target!(|data: &[u8]| {
    let _ = frame::classify(data);
    if let Some((&cut, rest)) = data.split_first() {
        let cut = (cut as usize) % (rest.len() + 1);
        let (a, b) = rest.split_at(cut);
        let seg = frame::inspect_segments(&[a, b]);
        let whole = frame::inspect(rest);
        assert_eq!(seg, whole, "segmented and contiguous parses disagree");
        if let Ok(p) = frame::parse(rest) {
            let mut out = vec![0u8; p.frame_len];
            p.repr.emit(&mut out, p.payload(rest)).expect("re-emit");
            // Reserved/derived bits are kept; only the IP/UDP checksums and pad bytes may
            // differ (a parsed frame with non-zero pad bytes re-emits zeros).
            let again = frame::parse(&out).expect("re-emitted frame parses");
            assert_eq!(again.repr.transport, p.repr.transport);
        }
    }
});
