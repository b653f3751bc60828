//! The RDMA resources of a test, laid out as perftest lays them out (docs/perftest-protocol.md
//! section 4), so that a perftest peer's addressing fits the region we advertise.

use dataplane::{Buffer, Mr, Verbs};
use roce::engine::{CqId, QpInit, VerbsError};
use roce::memory::PdId;
use roce::types::{Gid, Psn, Qkey, Qpn, Rkey};
use roce::verbs::*;

use super::oob::Key;
use super::{Conn, Kind, Params, Verb};

/// perftest's UD Q_Key.
pub const DEF_QKEY: u32 = 0x1111_1111;
/// GRH bytes in front of every UD receive.
pub const GRH: u64 = 40;

/// `INC(s, cl)`: `s` rounded up to the cache line (at least one line).
pub fn inc(s: u64, cl: u64) -> u64 {
    if s > cl {
        s.div_ceil(cl) * cl
    } else {
        cl
    }
}

/// `BUFF_SIZE(s, cb)`.
pub fn buff_size(s: u64, cb: u64) -> u64 {
    s.max(cb)
}

/// A 24-bit random PSN (perftest: `lrand48() & 0xffffff`).
pub fn random_psn() -> u32 {
    (seed() as u32) & 0xff_ffff
}

/// A fresh random 64-bit value (time, PID and a counter through splitmix64).
pub fn seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CTR: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    splitmix(t ^ ((std::process::id() as u64) << 32) ^ CTR.fetch_add(0x9e37, Ordering::Relaxed))
}

/// splitmix64.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The `--verify` pattern of message `seq` on QP `qp`: the sequence number in the first 8
/// bytes (as far as they fit), then bytes derived from it.
pub fn pattern(qp: u32, seq: u64, out: &mut [u8]) {
    let s = seq.to_le_bytes();
    let mut x = splitmix(seq ^ ((qp as u64) << 48));
    for (i, b) in out.iter_mut().enumerate() {
        if i < 8 {
            *b = s[i];
        } else {
            if i % 8 == 0 {
                x = splitmix(x);
            }
            *b = (x >> ((i % 8) * 8)) as u8;
        }
    }
}

/// The attributes that take a QP to RTR towards the peer's QP `dest_qpn`, whose first PSN is
/// `rq_psn`, over `av`; a UD QP takes none of the path. `responder` (RC): the RDMA
/// READs/ATOMICs it serves at once, with perftest's minimum RNR NAK timer.
pub fn rtr_attr(
    ud: bool,
    mtu: Mtu,
    dest_qpn: u32,
    rq_psn: u32,
    av: AddressVector,
    responder: Option<u8>,
) -> QpAttr {
    if ud {
        return QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        };
    }
    QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(mtu),
        dest_qp: Some(Qpn::new(dest_qpn)),
        rq_psn: Some(Psn::new(rq_psn)),
        av: Some(av),
        max_dest_rd_atomic: responder,
        min_rnr_timer: responder.map(|_| 12),
        ..Default::default()
    }
}

/// The attributes that take a QP from RTR to RTS, sending from `sq_psn`. `requester`
/// (connected QPs that retry): the ACK timeout and the RDMA READs/ATOMICs it has
/// outstanding at once, with retry and RNR retry counts of 7.
pub fn rts_attr(sq_psn: u32, requester: Option<(u8, u8)>) -> QpAttr {
    match requester {
        Some((timeout, max_rd_atomic)) => QpAttr::rts(Psn::new(sq_psn), timeout, max_rd_atomic),
        None => QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(sq_psn)),
            ..Default::default()
        },
    }
}

/// A test's verbs objects and memory.
pub struct Res<V: Verbs> {
    /// The verbs context.
    pub ctx: V,
    /// Protection domain.
    pub pd: PdId,
    /// Send CQ (and receive CQ except for SEND tests).
    pub scq: CqId,
    /// Receive CQ.
    pub rcq: CqId,
    /// QPs.
    pub qps: Vec<Qpn>,
    /// The buffer: per QP a local (source) slot, then per QP the advertised region.
    pub buf: Buffer,
    /// Its MR.
    pub mr: Mr,
    /// `INC(BUFF_SIZE(max size, cycle buffer), cache line)`.
    pub slot: u64,
    /// Size of each advertised region.
    pub region: u64,
    /// Agreed cycle buffer.
    pub cycle_buffer: u64,
    /// Agreed cache line.
    pub cache_line: u64,
    /// Our GID index and GID.
    pub gid_index: u8,
    /// Traffic class of paths (`-T`).
    pub tos: u8,
    /// Service level of paths (`-S`).
    pub sl: u8,
    /// Our GID.
    pub gid: Gid,
    /// Agreed path MTU.
    pub mtu: Mtu,
    /// Responder depth we advertise (READ/ATOMIC; else 1).
    pub out_reads: u8,
    /// Our keys, one per QP.
    pub my_keys: Vec<Key>,
    /// `--verify` slots: per QP `tx_depth` send slots then `rx_depth` receive slots.
    pub vbuf: Option<(Buffer, Mr)>,
    /// Size of a verify slot.
    pub vslot: u64,
    /// `-e`: wait for completions by sleeping on CQ events.
    pub events: bool,
    /// Q_Key of the UD QPs and of their peers' (perftest's 0x11111111; rdma_cm's with `-R`).
    pub qkey: u32,
}

/// The port's facts a test needs before the exchange.
pub struct PortFacts {
    /// Active path MTU.
    pub active_mtu: Mtu,
    /// GID index chosen.
    pub gid_index: u8,
    /// That GID.
    pub gid: Gid,
    /// Device's max_qp_rd_atom.
    pub max_rd_atom: u8,
}

/// The first IPv4-mapped GID among the port's first `gid_tbl_len` (at most 16): its index
/// and the GID.
pub fn first_ipv4_gid<V: Verbs>(ctx: &mut V, gid_tbl_len: u32) -> Option<(u8, Gid)> {
    (0..gid_tbl_len.min(16) as u8).find_map(|i| {
        ctx.query_gid(i)
            .ok()
            .filter(|g| g.is_ipv4_mapped())
            .map(|g| (i, g))
    })
}

/// Queries the port and picks the GID (`-x`, or the first IPv4-mapped GID as perftest's
/// `get_best_gid_index` prefers, else 0).
pub fn port_facts<V: Verbs>(ctx: &mut V, p: &Params) -> Result<PortFacts, String> {
    let port = ctx.query_port().map_err(|e| format!("query port: {e}"))?;
    let dev = ctx
        .query_device()
        .map_err(|e| format!("query device: {e}"))?;
    let (gid_index, gid) = match p.gid_index {
        Some(i) => (
            i,
            ctx.query_gid(i)
                .map_err(|e| format!("-x {i}: no such GID ({e})"))?,
        ),
        None => match first_ipv4_gid(ctx, port.gid_tbl_len) {
            Some(x) => x,
            None => (0, ctx.query_gid(0).map_err(|e| format!("GID 0: {e}"))?),
        },
    };
    Ok(PortFacts {
        active_mtu: port.active_mtu,
        gid_index,
        gid,
        max_rd_atom: dev.limits.max_qp_rd_atom,
    })
}

/// The local MTU perftest uses: `-m` clamped to the port's active MTU, or the active MTU.
pub fn local_mtu(p: &Params, f: &PortFacts) -> Mtu {
    match p.mtu {
        Some(m) if (m as u32) < (f.active_mtu as u32) => m,
        _ => f.active_mtu,
    }
}

impl<V: Verbs> Res<V> {
    /// Creates CQs, QPs (in RESET), the buffer and its MR (section 4).
    pub fn create(
        mut ctx: V,
        p: &Params,
        f: &PortFacts,
        cycle_buffer: u64,
        cache_line: u64,
        mtu: Mtu,
    ) -> Result<Res<V>, String> {
        let err = |what: &'static str| move |e: VerbsError| format!("{what}: {e}");
        let n = p.qps as u64;
        let slot = inc(buff_size(p.max_size, cycle_buffer), cache_line);
        // --verify with WRITE gives every message its own place in the advertised region.
        let region = if p.verify && p.verb == Verb::Write && p.kind == Kind::Bw {
            slot.max(p.iters * inc(p.max_size, cache_line))
        } else {
            slot
        };
        let mut len = slot * n + region * n;
        if p.conn == Conn::UD {
            len += cache_line;
        }
        let pd = ctx.alloc_pd().map_err(err("alloc PD"))?;
        let scq = ctx
            .create_cq((p.tx_depth * p.qps).max(1) * 2)
            .map_err(err("create send CQ"))?;
        let rcq = if p.verb == Verb::Send || p.write_imm {
            ctx.create_cq((p.rx_depth * p.qps).max(1) * 2)
                .map_err(err("create receive CQ"))?
        } else {
            scq
        };
        let buf = ctx
            .alloc_buffer(len as usize)
            .map_err(err("allocate buffer"))?;
        if p.verb == Verb::Write && p.kind == Kind::Lat {
            buf.fill(0);
        } else {
            fill_random(&buf);
        }
        let access = match p.verb {
            Verb::Write => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            Verb::Read => Access::LOCAL_WRITE | Access::REMOTE_READ,
            Verb::Atomic => Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            Verb::Send => Access::LOCAL_WRITE,
        };
        let mr = ctx
            .reg_mr(pd, &buf, 0, len as usize, access)
            .map_err(err("register MR"))?;
        let qp_type = match p.conn {
            Conn::RC => QpType::Rc,
            Conn::UC => QpType::Uc,
            Conn::UD => QpType::Ud,
        };
        let mut qps = Vec::new();
        for _ in 0..p.qps {
            let q = ctx
                .create_qp(&QpInit {
                    pd,
                    qp_type,
                    send_cq: scq,
                    recv_cq: rcq,
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: p.tx_depth,
                        max_recv_wr: p.rx_depth,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: p.inline,
                    },
                    sq_sig_all: false,
                })
                .map_err(err("create QP"))?;
            qps.push(q);
        }
        let out_reads = match p.verb {
            Verb::Read | Verb::Atomic => match p.outs {
                Some(o) if o > 0 => o.min(f.max_rd_atom),
                _ => f.max_rd_atom,
            },
            _ => 1,
        };
        let remote_rkey = mr.rkey.map(|k| k.0).unwrap_or(0);
        let my_keys = qps
            .iter()
            .enumerate()
            .map(|(i, q)| Key {
                lid: 0,
                out_reads: out_reads as u16,
                qpn: q.value(),
                psn: random_psn(),
                rkey: remote_rkey,
                vaddr: mr.addr + n * slot + i as u64 * region,
                gid: f.gid.0,
                srqn: 0,
            })
            .collect();
        let vslot = inc(p.max_size + GRH, cache_line);
        let vbuf = if p.verify {
            let total = vslot * n * (p.tx_depth + p.rx_depth) as u64;
            if total > 1 << 30 {
                return Err(format!(
                    "--verify needs {total} bytes of message slots; lower -t/-r or the size"
                ));
            }
            let vb = ctx
                .alloc_buffer(total as usize)
                .map_err(err("allocate verify buffer"))?;
            let vm = ctx
                .reg_mr(pd, &vb, 0, total as usize, Access::LOCAL_WRITE)
                .map_err(err("register verify MR"))?;
            Some((vb, vm))
        } else {
            None
        };
        Ok(Res {
            ctx,
            pd,
            scq,
            rcq,
            qps,
            buf,
            mr,
            slot,
            region,
            cycle_buffer,
            cache_line,
            gid_index: f.gid_index,
            tos: p.tos,
            sl: p.sl,
            gid: f.gid,
            mtu,
            out_reads,
            my_keys,
            vbuf,
            vslot,
            events: p.events,
            qkey: DEF_QKEY,
        })
    }

    /// Offset in `buf` of QP `i`'s local (source) slot.
    pub fn local_off(&self, i: usize) -> u64 {
        i as u64 * self.slot
    }

    /// Offset in `buf` of QP `i`'s advertised region.
    pub fn remote_off(&self, i: usize) -> u64 {
        self.qps.len() as u64 * self.slot + i as u64 * self.region
    }

    /// Offset in the verify buffer of QP `qp`'s send slot `k` (k < tx_depth).
    pub fn vsend_off(&self, p: &Params, qp: usize, k: u64) -> u64 {
        (qp as u64 * (p.tx_depth + p.rx_depth) as u64 + k) * self.vslot
    }

    /// Offset in the verify buffer of QP `qp`'s receive slot `k` (k < rx_depth).
    pub fn vrecv_off(&self, p: &Params, qp: usize, k: u64) -> u64 {
        (qp as u64 * (p.tx_depth + p.rx_depth) as u64 + p.tx_depth as u64 + k) * self.vslot
    }

    /// INIT -> RTR (-> RTS when `to_rts`) towards the peer's keys (section 4.3).
    pub fn connect(&mut self, p: &Params, rem: &[Key], to_rts: bool) -> Result<(), String> {
        for (i, qpn) in self.qps.clone().into_iter().enumerate() {
            let r = rem[i];
            let mut init = QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                ..Default::default()
            };
            if p.conn == Conn::UD {
                init.qkey = Some(Qkey(self.qkey));
            } else {
                init.access = Some(match p.verb {
                    Verb::Write => Access::REMOTE_WRITE,
                    Verb::Read => Access::REMOTE_READ,
                    Verb::Atomic => Access::REMOTE_ATOMIC,
                    Verb::Send => Access::REMOTE_WRITE | Access::LOCAL_WRITE,
                });
            }
            self.ctx
                .modify_qp(qpn, &init)
                .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
            let rtr = rtr_attr(
                p.conn == Conn::UD,
                self.mtu,
                r.qpn,
                r.psn,
                self.av(&r),
                (p.conn == Conn::RC).then_some(self.out_reads),
            );
            self.ctx
                .modify_qp(qpn, &rtr)
                .map_err(|e| format!("Failed to modify QP {} to RTR: {e}", qpn.value()))?;
            if to_rts {
                let rts = rts_attr(
                    self.my_keys[i].psn,
                    (p.conn == Conn::RC).then(|| (p.qp_timeout, (r.out_reads.clamp(1, 255)) as u8)),
                );
                self.ctx
                    .modify_qp(qpn, &rts)
                    .map_err(|e| format!("Failed to modify QP {} to RTS: {e}", qpn.value()))?;
            }
        }
        Ok(())
    }

    /// The path to a peer (perftest: GRH with hop limit 0xFF, traffic class 0).
    pub fn av(&self, r: &Key) -> AddressVector {
        let mut av = AddressVector::new(Gid(r.gid), self.gid_index);
        av.hop_limit = 0xff;
        av.traffic_class = self.tos;
        av.sl = self.sl;
        av
    }

    /// Posts one receive on QP `qp` into `sge`.
    pub fn post_recv(&mut self, qp: usize, wr_id: u64, sge: Sge) -> Result<(), String> {
        self.ctx
            .post_recv(
                self.qps[qp],
                &RecvWr {
                    wr_id,
                    sg_list: &[sge],
                },
            )
            .map_err(|e| format!("Couldn't post receive: {e}"))
    }

    /// The receive SGE perftest uses for QP `qp` (its advertised region; UD leaves room for
    /// the GRH so the payload lands cache-aligned).
    pub fn recv_sge(&self, p: &Params, qp: usize, size: u64) -> Sge {
        if p.conn == Conn::UD {
            self.mr.sge(
                self.remote_off(qp) + self.cache_line - GRH,
                (size + GRH) as u32,
            )
        } else {
            self.mr.sge(self.remote_off(qp), size as u32)
        }
    }

    /// A UD destination from a peer key.
    pub fn ud_dest(&self, r: &Key) -> UdDest {
        UdDest {
            ah: self.av(r),
            remote_qpn: Qpn::new(r.qpn),
            remote_qkey: Qkey(self.qkey),
        }
    }

    /// The rkey of a peer key.
    pub fn rkey(r: &Key) -> Rkey {
        Rkey(r.rkey)
    }

    /// Moves QPs to ERR and destroys everything (errors are ignored: this is cleanup).
    pub fn destroy(mut self) {
        for q in &self.qps {
            let _ = self.ctx.destroy_qp(*q);
        }
        let _ = self.ctx.dereg_mr(&self.mr);
        if let Some((_, vm)) = &self.vbuf {
            let _ = self.ctx.dereg_mr(vm);
        }
        let _ = self.ctx.destroy_cq(self.scq);
        if self.rcq != self.scq {
            let _ = self.ctx.destroy_cq(self.rcq);
        }
        let _ = self.ctx.dealloc_pd(self.pd);
    }
}

/// Fills a buffer with pseudo-random bytes (perftest fills with `rand()`).
pub fn fill_random(buf: &Buffer) {
    let mut x = seed();
    let mut chunk = vec![0u8; 65536.min(buf.len().max(1))];
    let mut off = 0;
    while off < buf.len() {
        for w in chunk.chunks_mut(8) {
            x = splitmix(x);
            let b = x.to_le_bytes();
            w.copy_from_slice(&b[..w.len()]);
        }
        let n = chunk.len().min(buf.len() - off);
        buf.write(off, &chunk[..n]);
        off += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_macros() {
        assert_eq!(inc(8, 64), 64);
        assert_eq!(inc(65, 64), 128);
        assert_eq!(inc(4096, 64), 4096);
        assert_eq!(buff_size(4096, 4096), 4096);
        assert_eq!(buff_size(65536, 4096), 65536);
        assert_eq!(buff_size(8, 4096), 4096);
        // write_bw_2qp: 8 KiB messages advertise regions 0x2000 apart.
        assert_eq!(inc(buff_size(8192, 4096), 64), 0x2000);
    }

    #[test]
    fn patterns_differ_per_message() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        pattern(0, 1, &mut a);
        pattern(0, 2, &mut b);
        assert_ne!(a, b);
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 1);
        let mut c = [0u8; 64];
        pattern(1, 1, &mut c);
        assert_ne!(a[8..], c[8..]);
        assert!(random_psn() <= 0xff_ffff);
    }
}
