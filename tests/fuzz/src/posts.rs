//! A client's post ring as a worker reads it (`ferroce_host::abi::slots::next_post`, what
//! rnicd runs on every client's ring): the ring's shared memory is the client's to write, so
//! its producer index and every cell are untrusted.
//!
//! Two kinds of input. Raw: the producer index and the cells come straight from the input.
//! Encoded: work requests built from the input are encoded by the application side's encoder
//! (`PostCells`, what the client libraries use) and pushed with its producer, then one byte
//! may be changed.
//!
//! Invariants checked: nothing panics; the reader never takes more cells than were
//! published, and stops at the first post that breaks the protocol (rnicd then closes the
//! client); a decoded post stays within the host interface's limits (`MAX_HOST_SGE` SGEs,
//! `MAX_INLINE` inline bytes); an encoded post nobody changed decodes to the work request
//! that was encoded.

use std::sync::Arc;

use ferroce_host::abi::area::Area;
use ferroce_host::abi::ring::{ring_bytes, Consumer, Producer};
use ferroce_host::abi::slots::{
    next_post, post_kind, Post, PostBuf, PostCell, PostCells, CELL_BYTES, MAX_HOST_SGE,
};
use roce::engine::MAX_INLINE;
use roce::types::{Lkey, Qkey, Qpn, Rkey};
use roce::verbs::*;

use crate::Input;

/// Cells in the ring.
const CAP: usize = 64;
/// Where the producer index is in the ring's area (`ring.rs`'s layout).
const TAIL: usize = 64;
/// Where the slots start.
const SLOTS: usize = 128;

thread_local! {
    /// One shared area for every input (a memfd and a mapping each time would dominate).
    static AREA: Arc<Area> =
        Arc::new(Area::new(ring_bytes::<PostCell>(CAP), "fuzz-posts").expect("area"));
}

/// Runs one input (see the module's doc); returns how many encoded posts round-tripped.
pub fn run(data: &[u8]) -> usize {
    let area = AREA.with(|a| a.clone());
    // Both indices back to 0, every slot zero.
    area.write_at(0, &vec![0u8; ring_bytes::<PostCell>(CAP)])
        .expect("in bounds");
    let mut inp = Input::new(data);
    let mut expect = Vec::new();
    let published = if inp.u8() & 1 == 0 {
        let tail = inp.u8() as u64 % (2 * CAP as u64 + 2);
        area.write_at(TAIL, &tail.to_le_bytes()).expect("in bounds");
        let cells = inp.bytes(CAP * CELL_BYTES);
        area.write_at(SLOTS, cells).expect("in bounds");
        tail
    } else {
        // What is done to the ring once written: one byte changed (a mask, at a place), or
        // fewer cells published.
        let (mask, at, cut) = (inp.u8(), inp.u16() as usize, inp.u8() as u64);
        let mut prod = Producer::<PostCell>::attach(area.clone(), CAP);
        let mut n = 0;
        while !inp.is_empty() && expect.len() < 8 {
            let (wr, sges, inline) = work_request(&mut inp);
            if !the_client_would_post(&wr, &sges, inline.as_deref()) {
                continue;
            }
            let cells = match &wr {
                Wr::Send(qpn, w) => PostCells::send(*qpn, &w.with(&sges), inline.as_deref()),
                Wr::Recv(kind, h, id) => PostCells::recv(*kind, *h, *id, &sges),
            };
            let Ok(cells) = cells else {
                continue;
            };
            if !prod.room(cells.cells()) {
                break;
            }
            cells.write(|c| {
                prod.stage(c);
            });
            n += cells.cells() as u64;
            expect.push((wr, sges, inline));
        }
        prod.publish();
        if mask != 0 && n > 0 {
            let off = SLOTS + at % (n as usize * CELL_BYTES);
            let mut b = [0u8];
            area.read_at(off, &mut b).expect("in bounds");
            area.write_at(off, &[b[0] ^ mask]).expect("in bounds");
            expect.clear();
        }
        // Or fewer cells published than were written (a client that publishes a post's
        // head before the rest): the posts wholly published decode, the cut one is refused.
        if cut != 0 && n > 0 {
            let tail = n - 1 - cut % n;
            area.write_at(TAIL, &tail.to_le_bytes()).expect("in bounds");
            expect.clear();
            return finish(area, tail, expect);
        }
        n
    };
    finish(area, published, expect)
}

/// Reads the ring the way rnicd does and checks what it took (see the module's doc).
fn finish(area: Arc<Area>, published: u64, expect: Vec<(Wr, Vec<Sge>, Option<Vec<u8>>)>) -> usize {
    let mut posts = Consumer::<PostCell>::attach(area, CAP);
    let mut buf = PostBuf::default();
    let mut decoded = Vec::new();
    // Cells the decoded posts' heads call for.
    let mut cells = 0;
    loop {
        let need = posts.peek(0).map(|c| c.head().cells());
        let Some(r) = next_post(&mut posts, &mut buf) else {
            break;
        };
        assert!(decoded.len() < CAP, "more posts than cells");
        if let Err(e) = r {
            assert!(expect.is_empty(), "an encoded post refused: {e} {expect:?}");
            break;
        }
        cells += need
            .expect("a post decoded from a head")
            .expect("a head that checks");
        let post = buf.post().expect("a decoded post");
        check_limits(&post);
        decoded.push(Owned::from_post(&post));
    }
    // The consumer's index, as it published it for the producer: the cells it took.
    let mut head = [0u8; 8];
    posts.area().read_at(0, &mut head).expect("in bounds");
    let head = u64::from_le_bytes(head);
    assert!(
        head <= published && cells as u64 <= head,
        "posts of {cells} cells decoded from {head} cells taken, {published} published"
    );
    if !expect.is_empty() {
        assert_eq!(decoded.len(), expect.len(), "every encoded post decodes");
        for ((wr, sges, inline), got) in expect.iter().zip(&decoded) {
            assert_eq!(*got, wr.owned(sges, inline), "round trip");
        }
    }
    expect.len()
}

/// Whether the application side posts this WR (`Client::post_send_data`): the engine's own
/// synchronous checks pass, and inline bytes go only with the INLINE flag on a SEND or WRITE
/// (anything else is refused at the call, never encoded).
fn the_client_would_post(wr: &Wr, sges: &[Sge], inline: Option<&[u8]>) -> bool {
    let Wr::Send(_, w) = wr else {
        return sges.len() <= MAX_HOST_SGE;
    };
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: MAX_HOST_SGE as u32,
        max_recv_sge: MAX_HOST_SGE as u32,
        max_inline_data: MAX_INLINE as u32,
    };
    let qp_type = if w.ud.is_some() {
        QpType::Ud
    } else {
        QpType::Rc
    };
    let inline_ok = w.flags.contains(SendFlags::INLINE) && !w.op.is_read_or_atomic();
    // With the INLINE flag on a SEND or WRITE the client gathers the bytes and posts them
    // inline (this harness has no memory to gather from: such a WR comes with its bytes);
    // on anything else the flag is ignored and inline bytes are refused.
    inline.is_some() == inline_ok
        && roce::engine::check_send(qp_type, &caps, 4096, &w.with(sges), inline.map(|d| d.len()))
            .is_ok()
}

fn check_limits(post: &Post<'_>) {
    match post {
        Post::Send { wr, .. } => {
            assert!(wr.nsge <= MAX_HOST_SGE);
            assert!(wr.inline_len <= MAX_INLINE);
        }
        Post::Recv { sges, .. } | Post::SrqRecv { sges, .. } => {
            assert!(sges.len() <= MAX_HOST_SGE)
        }
    }
}

/// A send WR's fields apart from its SGEs.
#[derive(Debug, Clone, Copy)]
struct SendFields {
    wr_id: u64,
    op: WrOp,
    flags: SendFlags,
    ud: Option<UdDest>,
}

impl SendFields {
    fn with<'a>(&self, sges: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: sges,
            flags: self.flags,
            ud: self.ud,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Wr {
    Send(Qpn, SendFields),
    /// (post kind, QP or SRQ, wr_id)
    Recv(u8, u32, u64),
}

impl Wr {
    /// The post a worker should decode from this WR (an inline WR's SGEs are not sent).
    fn owned(&self, sges: &[Sge], inline: &Option<Vec<u8>>) -> Owned {
        match *self {
            Wr::Send(qpn, w) => Owned::Send {
                qpn,
                wr_id: w.wr_id,
                op: w.op,
                flags: w.flags,
                ud: w.ud,
                sges: if inline.is_some() {
                    Vec::new()
                } else {
                    sges.to_vec()
                },
                inline: inline.clone(),
            },
            Wr::Recv(kind, handle, wr_id) => Owned::Recv {
                srq: kind == post_kind::SRQ_RECV,
                handle,
                wr_id,
                sges: sges.to_vec(),
            },
        }
    }
}

/// A post's content, owned, for comparing what was encoded with what was decoded.
#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Send {
        qpn: Qpn,
        wr_id: u64,
        op: WrOp,
        flags: SendFlags,
        ud: Option<UdDest>,
        sges: Vec<Sge>,
        inline: Option<Vec<u8>>,
    },
    Recv {
        srq: bool,
        handle: u32,
        wr_id: u64,
        sges: Vec<Sge>,
    },
}

impl Owned {
    fn from_post(p: &Post<'_>) -> Owned {
        match *p {
            Post::Send { qpn, wr } => Owned::Send {
                qpn,
                wr_id: wr.wr_id,
                op: wr.op,
                flags: wr.flags,
                ud: wr.ud,
                sges: wr.sges[..wr.nsge].to_vec(),
                inline: wr.inline().map(|b| b.to_vec()),
            },
            Post::Recv { qpn, wr_id, sges } => Owned::Recv {
                srq: false,
                handle: qpn.value(),
                wr_id,
                sges: sges.to_vec(),
            },
            Post::SrqRecv { srq, wr_id, sges } => Owned::Recv {
                srq: true,
                handle: srq,
                wr_id,
                sges: sges.to_vec(),
            },
        }
    }
}

/// A work request built from the input, its SGEs and its inline bytes.
fn work_request(inp: &mut Input) -> (Wr, Vec<Sge>, Option<Vec<u8>>) {
    let kind = inp.u8();
    let nsge = inp.u8() as usize % (MAX_HOST_SGE + 2);
    let sges: Vec<Sge> = (0..nsge)
        .map(|_| Sge {
            addr: inp.u64(),
            length: inp.u32(),
            lkey: Lkey(inp.u32()),
        })
        .collect();
    let handle = inp.u32() & 0x00ff_ffff;
    let wr_id = inp.u64();
    match kind % 3 {
        1 => return (Wr::Recv(post_kind::RECV, handle, wr_id), sges, None),
        2 => return (Wr::Recv(post_kind::SRQ_RECV, handle, wr_id), sges, None),
        _ => {}
    }
    let (remote_addr, rkey) = (inp.u64(), Rkey(inp.u32()));
    let op = inp.wr_op(remote_addr, rkey);
    let flags = SendFlags(inp.u8() as u32 & 0x0f);
    let ud = (inp.u8() & 1 == 1).then(|| UdDest {
        ah: AddressVector::new(roce::types::Gid::from_ipv4([10, 99, 0, inp.u8()]), 1),
        remote_qpn: Qpn::new(inp.u32() & 0x00ff_ffff),
        remote_qkey: Qkey(inp.u32()),
    });
    let inline = (flags.contains(SendFlags::INLINE) && inp.u8() & 1 == 1).then(|| {
        let n = inp.u16() as usize % (MAX_INLINE + 8);
        let b = inp.u8();
        vec![b; n]
    });
    let f = SendFields {
        wr_id,
        op,
        flags,
        ud,
    };
    (Wr::Send(Qpn::new(handle), f), sges, inline)
}
