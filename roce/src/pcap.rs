//! Capture files: a reader for pcap (either byte order, micro- or nanosecond timestamps) and
//! pcapng (section, interface, enhanced and simple packet blocks), and a nanosecond pcap
//! writer. Format only: the caller supplies bytes or a `Write`.
//!
//! Used by `rnic-pcap`, by the dataplane's capture tap and by the simulator to dump sessions
//! that tshark and Wireshark can open. Only Ethernet link types are accepted for reading.

use std::io::{self, Write};

/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Timestamp in nanoseconds since the epoch (or since the capture start for simulations).
    pub ts_ns: u64,
    /// Captured bytes.
    pub data: &'a [u8],
    /// Original length on the wire (may exceed `data.len()` if the capture was truncated).
    pub orig_len: u32,
}

/// Why a capture cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PcapError {
    /// Not a pcap or pcapng file.
    #[error("not a pcap or pcapng file (magic {0:#010x})")]
    BadMagic(u32),
    /// The link type is not Ethernet.
    #[error("link type {0} is not Ethernet (1)")]
    NotEthernet(u32),
    /// The file ends inside a header or record.
    #[error("capture truncated at byte {0}")]
    Truncated(usize),
    /// A pcapng block is malformed.
    #[error("malformed pcapng block at byte {0}")]
    BadBlock(usize),
}

#[derive(Debug, Clone, Copy)]
enum Format {
    Pcap { big_endian: bool, nanos: bool },
    PcapNg { big_endian: bool },
}

/// Iterates over the frames of a capture held in memory.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    off: usize,
    format: Format,
    /// pcapng: timestamp resolution (units per second) of each interface, in order.
    if_tsres: Vec<u64>,
    failed: bool,
}

fn rd32(b: &[u8], at: usize, be: bool) -> Option<u32> {
    let x: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(if be {
        u32::from_be_bytes(x)
    } else {
        u32::from_le_bytes(x)
    })
}

fn rd16(b: &[u8], at: usize, be: bool) -> Option<u16> {
    let x: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(if be {
        u16::from_be_bytes(x)
    } else {
        u16::from_le_bytes(x)
    })
}

impl<'a> Reader<'a> {
    /// Opens a capture; checks the magic and (for pcap) the link type.
    pub fn new(data: &'a [u8]) -> Result<Reader<'a>, PcapError> {
        let magic_le = rd32(data, 0, false).ok_or(PcapError::Truncated(0))?;
        // pcap's four magics: the byte order as read, and microsecond or nanosecond stamps.
        const PCAP: [(u32, bool, bool); 4] = [
            (0xa1b2_c3d4, false, false),
            (0xa1b2_3c4d, false, true),
            (0xd4c3_b2a1, true, false),
            (0x4d3c_b2a1, true, true),
        ];
        let format =
            if let Some(&(_, big_endian, nanos)) = PCAP.iter().find(|(m, _, _)| *m == magic_le) {
                Format::Pcap { big_endian, nanos }
            } else if magic_le == 0x0a0d_0d0a {
                let bom = rd32(data, 8, false).ok_or(PcapError::Truncated(8))?;
                let big_endian = match bom {
                    0x1a2b_3c4d => false,
                    0x4d3c_2b1a => true,
                    _ => return Err(PcapError::BadBlock(0)),
                };
                Format::PcapNg { big_endian }
            } else {
                return Err(PcapError::BadMagic(magic_le));
            };
        let mut r = Reader {
            data,
            off: 0,
            format,
            if_tsres: Vec::new(),
            failed: false,
        };
        if let Format::Pcap { big_endian, .. } = format {
            if data.len() < 24 {
                return Err(PcapError::Truncated(data.len()));
            }
            let lt = rd32(data, 20, big_endian).ok_or(PcapError::Truncated(20))? & 0x0fff_ffff;
            if lt != LINKTYPE_ETHERNET {
                return Err(PcapError::NotEthernet(lt));
            }
            r.off = 24;
        }
        Ok(r)
    }

    fn next_pcap(&mut self, be: bool, nanos: bool) -> Option<Result<Record<'a>, PcapError>> {
        let d = self.data;
        if self.off == d.len() {
            return None;
        }
        let at = self.off;
        let (Some(sec), Some(frac), Some(cap), Some(orig)) = (
            rd32(d, at, be),
            rd32(d, at + 4, be),
            rd32(d, at + 8, be),
            rd32(d, at + 12, be),
        ) else {
            return Some(Err(PcapError::Truncated(at)));
        };
        let start = at + 16;
        let end = start.checked_add(cap as usize)?;
        let Some(data) = d.get(start..end) else {
            return Some(Err(PcapError::Truncated(at)));
        };
        self.off = end;
        let ts_ns = sec as u64 * 1_000_000_000 + frac as u64 * if nanos { 1 } else { 1000 };
        Some(Ok(Record {
            ts_ns,
            data,
            orig_len: orig,
        }))
    }

    fn next_pcapng(&mut self, be: bool) -> Option<Result<Record<'a>, PcapError>> {
        let d = self.data;
        loop {
            if self.off >= d.len() {
                return None;
            }
            let at = self.off;
            let (Some(btype), Some(blen)) = (rd32(d, at, be), rd32(d, at + 4, be)) else {
                return Some(Err(PcapError::Truncated(at)));
            };
            let blen = blen as usize;
            if blen < 12 || !blen.is_multiple_of(4) || at + blen > d.len() {
                return Some(Err(PcapError::BadBlock(at)));
            }
            let body = &d[at + 8..at + blen - 4];
            self.off = at + blen;
            match btype {
                // Section header: a new section resets the interfaces.
                0x0a0d_0d0a => self.if_tsres.clear(),
                // Interface description: link type and, optionally, if_tsresol (option 9).
                1 => {
                    let lt = rd16(body, 0, be).unwrap_or(0) as u32;
                    if lt != LINKTYPE_ETHERNET {
                        return Some(Err(PcapError::NotEthernet(lt)));
                    }
                    let mut res = 1_000_000u64;
                    let mut o = 8;
                    while o + 4 <= body.len() {
                        let code = rd16(body, o, be).unwrap_or(0);
                        let len = rd16(body, o + 2, be).unwrap_or(0) as usize;
                        if code == 0 {
                            break;
                        }
                        if code == 9 && len >= 1 {
                            if let Some(&v) = body.get(o + 4) {
                                let exp = (v & 0x7f) as u32;
                                res = if v & 0x80 != 0 {
                                    2u64.checked_pow(exp).unwrap_or(u64::MAX)
                                } else {
                                    10u64.checked_pow(exp).unwrap_or(u64::MAX)
                                };
                            }
                        }
                        o += 4 + len.div_ceil(4) * 4;
                    }
                    self.if_tsres.push(res.max(1));
                }
                // Enhanced packet block.
                6 => {
                    let (Some(ifid), Some(hi), Some(lo), Some(cap), Some(orig)) = (
                        rd32(body, 0, be),
                        rd32(body, 4, be),
                        rd32(body, 8, be),
                        rd32(body, 12, be),
                        rd32(body, 16, be),
                    ) else {
                        return Some(Err(PcapError::BadBlock(at)));
                    };
                    let Some(data) = body.get(20..20 + cap as usize) else {
                        return Some(Err(PcapError::BadBlock(at)));
                    };
                    let res = self
                        .if_tsres
                        .get(ifid as usize)
                        .copied()
                        .unwrap_or(1_000_000);
                    let units = ((hi as u64) << 32) | lo as u64;
                    let ts_ns = (units as u128 * 1_000_000_000 / res as u128) as u64;
                    return Some(Ok(Record {
                        ts_ns,
                        data,
                        orig_len: orig,
                    }));
                }
                // Simple packet block: no timestamp; captured length is what fits.
                3 => {
                    let orig = rd32(body, 0, be).unwrap_or(0);
                    let data = &body[4.min(body.len())..];
                    let data = &data[..(orig as usize).min(data.len())];
                    return Some(Ok(Record {
                        ts_ns: 0,
                        data,
                        orig_len: orig,
                    }));
                }
                _ => {}
            }
        }
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = match self.format {
            Format::Pcap { big_endian, nanos } => self.next_pcap(big_endian, nanos),
            Format::PcapNg { big_endian } => self.next_pcapng(big_endian),
        };
        if matches!(r, Some(Err(_))) {
            self.failed = true;
        }
        r
    }
}

/// Writes a classic pcap with nanosecond timestamps and Ethernet link type.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    snaplen: u32,
}

impl<W: Write> Writer<W> {
    /// Writes the file header (snap length 262144, as tcpdump's default).
    pub fn new(out: W) -> io::Result<Writer<W>> {
        Self::with_snaplen(out, 262_144)
    }

    /// Writes the file header; frames are cut to `snaplen` bytes (their original length is
    /// still recorded).
    pub fn with_snaplen(mut out: W, snaplen: u32) -> io::Result<Writer<W>> {
        let snaplen = snaplen.max(1);
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&0xa1b2_3c4du32.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(Writer { out, snaplen })
    }

    /// Appends one frame given as segments (e.g. headers and payload held apart).
    pub fn write_segments(&mut self, ts_ns: u64, segments: &[&[u8]]) -> io::Result<()> {
        let len: usize = segments.iter().map(|s| s.len()).sum();
        let cap = len.min(self.snaplen as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(cap as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        self.out.write_all(&h)?;
        let mut left = cap;
        for s in segments {
            let take = s.len().min(left);
            self.out.write_all(&s[..take])?;
            left -= take;
        }
        Ok(())
    }

    /// Appends one frame.
    pub fn write(&mut self, ts_ns: u64, frame: &[u8]) -> io::Result<()> {
        self.write_segments(ts_ns, &[frame])
    }

    /// Flushes and returns the inner writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// Flushes buffered output.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcap_round_trip() {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.write(1_500_000_123, &[1, 2, 3]).unwrap();
        w.write_segments(2_000_000_000, &[&[4, 5], &[6]]).unwrap();
        let bytes = w.into_inner().unwrap();
        let recs: Vec<_> = Reader::new(&bytes).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].ts_ns, 1_500_000_123);
        assert_eq!(recs[0].data, &[1, 2, 3]);
        assert_eq!(recs[1].data, &[4, 5, 6]);
        // A truncated file yields an error, then stops.
        let mut r = Reader::new(&bytes[..bytes.len() - 1]).unwrap();
        assert!(r.next().unwrap().is_ok());
        assert!(r.next().unwrap().is_err());
        assert!(r.next().is_none());
        assert!(matches!(Reader::new(&[0; 3]), Err(PcapError::Truncated(_))));
        assert!(matches!(Reader::new(&[0; 24]), Err(PcapError::BadMagic(0))));
    }

    #[test]
    fn pcapng_blocks() {
        fn block(t: u32, body: &[u8]) -> Vec<u8> {
            let len = 12 + body.len().div_ceil(4) * 4;
            let mut b = Vec::new();
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&(len as u32).to_le_bytes());
            b.extend_from_slice(body);
            b.resize(len - 4, 0);
            b.extend_from_slice(&(len as u32).to_le_bytes());
            b
        }
        let mut shb = Vec::new();
        shb.extend_from_slice(&0x1a2b3c4du32.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut idb = Vec::new();
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&0u32.to_le_bytes());
        // if_tsresol = 10^-9
        idb.extend_from_slice(&9u16.to_le_bytes());
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&[9, 0, 0, 0]);
        idb.extend_from_slice(&[0, 0, 0, 0]);
        let mut epb = Vec::new();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&1234u32.to_le_bytes());
        epb.extend_from_slice(&5u32.to_le_bytes());
        epb.extend_from_slice(&5u32.to_le_bytes());
        epb.extend_from_slice(&[9, 8, 7, 6, 5]);
        let mut file = block(0x0a0d0d0a, &shb);
        file.extend(block(1, &idb));
        file.extend(block(5, &[0; 8])); // interface statistics: skipped
        file.extend(block(6, &epb));
        let recs: Vec<_> = Reader::new(&file).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].data, &[9, 8, 7, 6, 5]);
        assert_eq!(recs[0].ts_ns, 1234);
    }
}
