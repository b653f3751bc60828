//! The bodies of the fuzz targets (`fuzz_targets/`), kept in a library so that the smoke test
//! (`tests/smoke.rs`, part of `cargo test --workspace`) runs the same code over seeds and
//! pseudo-random inputs on the stable toolchain, without libFuzzer.
//!
//! Each body panics on a broken invariant; an `Err` or a counted drop inside the code under
//! test is an expected outcome.

pub mod cm;
pub mod config;
pub mod frame;
pub mod neighbor;
pub mod nic;
pub mod pcap;
pub mod posts;
pub mod rx;

// The units and values several harnesses share.
/// A millisecond and a second of a simulated clock, in nanoseconds.
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The page size the harnesses lay their memory out by.
const PAGE: usize = 4096;
/// What the bytes around a registration hold, which nothing may overwrite.
const CANARY: u8 = 0xa5;
/// The Q_Key `roce::sim` gives UD QPs.
const QKEY: u32 = 0x1111_1111;

/// Runs `step` over `data` until the input is used up or `max` steps have run (a bound on the
/// time one input takes).
pub fn script(data: &[u8], max: usize, mut step: impl FnMut(&mut Input)) {
    let mut inp = Input::new(data);
    for _ in 0..max {
        if inp.is_empty() {
            break;
        }
        step(&mut inp);
    }
}

/// Runs each file named on the command line through `run` once: what a fuzz target's binary
/// does when built outside `cargo fuzz` (as `cargo test --workspace` builds every binary),
/// for replaying a crash.
pub fn run_files<R>(run: fn(&[u8]) -> R) {
    for f in std::env::args().skip(1) {
        run(&std::fs::read(&f).expect("read input"));
    }
}

/// A fuzz target's binary: libFuzzer's entry point under `cargo fuzz` (`--cfg fuzzing`),
/// [`run_files`] otherwise.
#[macro_export]
macro_rules! target {
    ($run:path) => {
        #[cfg(fuzzing)]
        libfuzzer_sys::fuzz_target!(|data: &[u8]| {
            let _ = $run(data);
        });

        #[cfg(not(fuzzing))]
        fn main() {
            $crate::run_files($run);
        }
    };
}

/// Transport headers from the input, as the frame-building targets make them: an opcode the
/// table knows (one of `opcodes`, mostly; any byte otherwise), the QP and the PSN base that
/// `aim` picks for it (given the QP selector byte and the opcode), a PSN within a signed byte
/// of that base, the BTH flags, and the extended headers' bytes. `None` if they do not parse.
pub fn transport_from_input(
    inp: &mut Input,
    opcodes: &[u8],
    aim: impl FnOnce(&mut Input, u8, roce::wire::opcode::Opcode) -> (roce::types::Qpn, u32),
) -> Option<roce::wire::frame::TransportRepr> {
    use roce::wire::opcode::Opcode;
    let b = inp.u8();
    let opcode = if b < 0xf0 {
        Opcode(opcodes[b as usize % opcodes.len()])
    } else {
        Opcode(inp.u8())
    };
    let t = inp.u8();
    let (qpn, base) = aim(inp, t, opcode);
    let psn = roce::types::Psn::new(base.wrapping_add(inp.u8() as i8 as u32) & 0x00ff_ffff);
    let mut bth = roce::wire::bth::BthRepr::new(opcode, qpn, psn);
    let flags = inp.u8();
    bth.se = flags & 1 != 0;
    bth.ack_req = flags & 2 != 0;
    bth.fecn = flags & 4 != 0;
    bth.becn = flags & 8 != 0;
    bth.migreq = flags & 16 != 0;
    bth.pad_count = (flags >> 5) & 3;
    let mut hdr = vec![0u8; 12];
    bth.emit(&mut hdr).ok()?;
    let ext_len = opcode.info().map_or(0, |i| i.ext_len);
    hdr.extend_from_slice(inp.bytes(ext_len));
    hdr.resize(12 + ext_len, 0);
    roce::wire::frame::TransportRepr::parse(&hdr)
        .ok()
        .map(|(tr, _)| tr)
}

/// A cursor over fuzz input: each read takes the next bytes, and reads past the end give
/// zeros (so any input is a complete script).
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// The next two bytes, big-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, big-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, big-endian.
    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }

    /// A work request's operation, its fields from the input: on `rkey` at `remote_addr` for
    /// the remote ones, invalidating or binding `rkey`.
    pub fn wr_op(&mut self, remote_addr: u64, rkey: roce::types::Rkey) -> roce::verbs::WrOp {
        use roce::verbs::{Access, WrOp};
        match self.u8() % 10 {
            0 => WrOp::Send,
            1 => WrOp::SendWithImm { imm: self.u32() },
            2 => WrOp::SendWithInv { rkey },
            3 => WrOp::Write { remote_addr, rkey },
            4 => WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: self.u32(),
            },
            5 => WrOp::Read { remote_addr, rkey },
            6 => WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare: self.u64(),
                swap: self.u64(),
            },
            7 => WrOp::FetchAdd {
                remote_addr,
                rkey,
                add: self.u64(),
            },
            8 => WrOp::LocalInv { rkey },
            _ => WrOp::BindMw {
                mw: rkey,
                rkey: roce::types::Rkey(self.u32()),
                mr: roce::types::Lkey(self.u32()),
                addr: remote_addr,
                length: self.u64(),
                access: Access(self.u32() & Access::ALL.0),
            },
        }
    }

    /// Up to `n` next bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }
}
