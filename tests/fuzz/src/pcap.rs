//! The capture reader (`roce::pcap::Reader`, what `rnic-pcap` and the corpus tests read):
//! any bytes give records or an error, never a panic; each record lies within the input and
//! the reader ends within one pass over it.

use roce::pcap::Reader;

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(r) = Reader::new(data) else {
        return;
    };
    let mut records = 0usize;
    for rec in r {
        let Ok(rec) = rec else {
            break;
        };
        let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
        let at = rec.data.as_ptr() as usize;
        assert!(
            rec.data.is_empty() || (at >= start && at + rec.data.len() <= end),
            "a record outside the input"
        );
        records += 1;
        // A record takes at least its header: no more records than that allows.
        assert!(records <= data.len() / 8 + 1, "the reader does not advance");
    }
}
