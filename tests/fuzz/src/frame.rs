//! The frame parser: any input, contiguous or split into two segments, gives a result or an
//! error and never panics; both parses agree; whatever parses re-emits to a frame that parses
//! to the same transport headers.

use roce::wire::frame;

/// Runs one input: its first byte says where to cut the rest into two segments.
pub fn run(data: &[u8]) {
    let _ = frame::classify(data);
    let _ = frame::dest_qpn(data);
    let _ = frame::gsi_mad(data);
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = (cut as usize) % (rest.len() + 1);
    let (a, b) = rest.split_at(cut);
    let seg = frame::inspect_segments(&[a, b]);
    let whole = frame::inspect(rest);
    assert_eq!(seg, whole, "segmented and contiguous parses disagree");
    if let Ok(p) = frame::parse(rest) {
        let mut out = vec![0u8; p.frame_len];
        p.repr.emit(&mut out, p.payload(rest)).expect("re-emit");
        // Reserved and derived bits are kept; only the IP/UDP checksums and pad bytes may
        // differ (a parsed frame with non-zero pad bytes re-emits zeros).
        let again = frame::parse(&out).expect("re-emitted frame parses");
        assert_eq!(again.repr.transport, p.repr.transport);
    }
}
