//! `rc_pingpong` / `ud_pingpong`: rdma-core's `ibv_rc_pingpong` and `ibv_ud_pingpong` examples
//! (docs/perftest-protocol.md section 7), so either end may be the rdma-core tool.

use std::io::Write;
use std::net::Ipv6Addr;
use std::time::Instant;

use clap::Args;
use dataplane::Verbs;
use roce::engine::{QpInit, VerbsError};
use roce::types::{Gid, Qkey, Qpn};
use roce::verbs::*;
use serde_json::{json, Value};

use super::bw::backoff;
use super::oob::{Oob, PpDest, Role};
use super::res::{random_psn, rtr_attr, rts_attr, DEF_QKEY, GRH};
use super::run::{Endpoint, CONNECT_PATIENCE};

/// Which example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PpKind {
    /// `ibv_rc_pingpong`.
    Rc,
    /// `ibv_ud_pingpong`.
    Ud,
}

/// The examples' flags.
#[derive(Debug, Clone, Args)]
pub struct PpArgs {
    /// Server address: run as the client (without it: run as the server).
    pub server: Option<String>,
    /// TCP port.
    #[arg(short = 'p', long = "tcp-port", default_value_t = 18515)]
    pub tcp_port: u16,
    /// Device name (accepted for compatibility).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Port number (must be 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Message size (RC default 4096; UD default min(2048, port MTU)).
    #[arg(short = 's', long = "size")]
    pub size: Option<u32>,
    /// Path MTU (RC; default 1024, not negotiated).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Receives to keep posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Iterations.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u32,
    /// Service level.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// GID index (default: the first IPv4-mapped GID; RoCE needs one).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u8>,
    /// Print one JSON document with the result on stdout (text goes to stderr).
    #[arg(long)]
    pub json: bool,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

fn gid_text(g: &[u8; 16]) -> String {
    Ipv6Addr::from(*g).to_string()
}

/// Runs one pingpong.
pub fn run<V: Verbs>(
    mut ctx: V,
    kind: PpKind,
    a: &PpArgs,
    endpoint: Endpoint,
    out: &mut dyn Write,
) -> Result<Value, String> {
    let e = |what: &'static str| move |err: VerbsError| format!("{what}: {err}");
    if a.ib_port != 1 {
        return Err(format!(
            "-i {}: ferroce devices have one port (1)",
            a.ib_port
        ));
    }
    if a.iters == 0 || a.rx_depth < 2 || a.rx_depth > 16384 {
        return Err("-n must be at least 1 and -r between 2 and 16384".into());
    }
    let port = ctx.query_port().map_err(e("query port"))?;
    let mtu = match kind {
        PpKind::Rc => match a.mtu {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            m => return Err(format!("-m {m}: must be 256, 512, 1024, 2048 or 4096")),
        },
        PpKind::Ud => port.active_mtu,
    };
    let size = match (kind, a.size) {
        (PpKind::Rc, s) => s.unwrap_or(4096),
        (PpKind::Ud, None) => 2048.min(port.active_mtu.bytes()),
        (PpKind::Ud, Some(s)) if s > port.active_mtu.bytes() => {
            return Err(format!(
                "Requested size larger than port MTU ({})",
                port.active_mtu.bytes()
            ))
        }
        (PpKind::Ud, Some(s)) => s,
    } as u64;
    if size == 0 || size > 1 << 30 {
        return Err(format!("-s {size}: between 1 and 1 GiB"));
    }
    let (gid_index, gid) = match a.gid_idx {
        Some(i) => (i, ctx.query_gid(i).map_err(e("query GID"))?),
        None => {
            let mut pick = (0u8, ctx.query_gid(0).map_err(e("query GID"))?);
            for i in 0..port.gid_tbl_len.min(16) as u8 {
                if let Ok(g) = ctx.query_gid(i) {
                    if g.is_ipv4_mapped() {
                        pick = (i, g);
                        break;
                    }
                }
            }
            pick
        }
    };
    let ud = kind == PpKind::Ud;
    let buf_len = if ud { size + GRH } else { size };
    let pd = ctx.alloc_pd().map_err(e("alloc PD"))?;
    let buf = ctx.alloc_buffer(buf_len as usize).map_err(e("buffer"))?;
    buf.fill(0x7b);
    let mr = ctx
        .reg_mr(pd, &buf, 0, buf_len as usize, Access::LOCAL_WRITE)
        .map_err(e("register MR"))?;
    let cq = ctx.create_cq(a.rx_depth + 1).map_err(e("create CQ"))?;
    let qpn = ctx
        .create_qp(&QpInit {
            pd,
            qp_type: if ud { QpType::Ud } else { QpType::Rc },
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: a.rx_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .map_err(e("create QP"))?;
    let mut init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        ..Default::default()
    };
    if ud {
        init.qkey = Some(Qkey(DEF_QKEY));
    } else {
        init.access = Some(Access(0));
    }
    ctx.modify_qp(qpn, &init)
        .map_err(e("Failed to modify QP to INIT"))?;
    let recv_sge = mr.sge(0, buf_len as u32);
    let post_recvs = |ctx: &mut V, n: u32| -> Result<u32, String> {
        for i in 0..n {
            if let Err(err) = ctx.post_recv(
                qpn,
                &RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &[recv_sge],
                },
            ) {
                if i == 0 {
                    return Err(format!("Couldn't post receive: {err}"));
                }
                return Ok(i);
            }
        }
        Ok(n)
    };
    // Receives go up before the exchange, so the peer's first message finds one.
    let mut routs = post_recvs(&mut ctx, a.rx_depth)?;
    let me = PpDest {
        lid: 0,
        qpn: qpn.value(),
        psn: random_psn(),
        gid: gid.0,
    };
    let sep = if ud { ":" } else { "," };
    let _ = writeln!(
        out,
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        me.lid,
        me.qpn,
        me.psn,
        gid_text(&me.gid)
    );
    let mut oob = match endpoint {
        Endpoint::Listen(l) => Oob::accept(l).map_err(|e| format!("accept: {e}"))?,
        Endpoint::Connect(h, p) => Oob::connect(&h, p, CONNECT_PATIENCE)
            .map_err(|e| format!("Couldn't connect to {h}:{p}: {e}"))?,
        Endpoint::Cm { .. } => return Err("the rdma-core pingpongs exchange over TCP only".into()),
    };
    let role = oob.role();
    let av_for = |peer: &PpDest| -> AddressVector {
        let mut av = AddressVector::new(Gid(peer.gid), gid_index);
        av.hop_limit = 1;
        av.sl = a.sl;
        av
    };
    let peer = oob.pingpong(&me, |peer| {
        let rtr = rtr_attr(ud, mtu, peer.qpn, peer.psn, av_for(peer), Some(1));
        ctx.modify_qp(qpn, &rtr)
            .map_err(|err| format!("Failed to modify QP to RTR: {err}"))?;
        let rts = rts_attr(me.psn, (!ud).then_some((14, 1)));
        ctx.modify_qp(qpn, &rts)
            .map_err(|err| format!("Failed to modify QP to RTS: {err}"))
    })?;
    drop(oob);
    let _ = writeln!(
        out,
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        peer.lid,
        peer.qpn,
        peer.psn,
        gid_text(&peer.gid)
    );
    if peer.gid == [0; 16] {
        return Err("the peer sent no GID (run it with -g): RoCE needs one".into());
    }
    let ud_dest = ud.then(|| UdDest {
        ah: av_for(&peer),
        remote_qpn: Qpn::new(peer.qpn),
        remote_qkey: Qkey(DEF_QKEY),
    });
    let send_sge = if ud {
        mr.sge(GRH, size as u32)
    } else {
        mr.sge(0, size as u32)
    };
    let post_send = |ctx: &mut V| -> Result<(), String> {
        ctx.post_send(
            qpn,
            &SendWr {
                wr_id: SEND_WRID,
                op: WrOp::Send,
                sg_list: &[send_sge],
                flags: SendFlags::SIGNALED,
                ud: ud_dest,
            },
        )
        .map_err(|err| format!("Couldn't post send: {err}"))
    };
    let iters = a.iters as u64;
    let mut pending = RECV_WRID;
    if role == Role::Client {
        post_send(&mut ctx)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wc = [Completion::default(); 2];
    let mut idle = 0u32;
    let mut last = Instant::now();
    while rcnt < iters || scnt < iters {
        let n = ctx.poll_cq(cq, &mut wc).map_err(e("poll CQ"))?;
        if n == 0 {
            idle += 1;
            backoff(idle.min(4000));
            if super::interrupted() {
                return Err(super::INTERRUPTED.into());
            }
            if last.elapsed().as_secs() > 30 {
                return Err(format!(
                    "no completion for 30 s (sent {scnt}, received {rcnt})"
                ));
            }
            continue;
        }
        idle = 0;
        last = Instant::now();
        for c in &wc[..n] {
            if c.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {:?} ({}) for wr_id {}",
                    c.status, c.status as u32, c.wr_id
                ));
            }
            match c.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(&mut ctx, a.rx_depth - routs)?;
                        if routs < a.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !c.wr_id;
            if scnt < iters && pending == 0 {
                post_send(&mut ctx)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let usec = secs * 1e6;
    let bytes = size * iters * 2;
    let _ = writeln!(
        out,
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / usec
    );
    let _ = writeln!(
        out,
        "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
        usec / iters as f64
    );
    let _ = ctx.destroy_qp(qpn);
    let _ = ctx.dereg_mr(&mr);
    let _ = ctx.destroy_cq(cq);
    let _ = ctx.dealloc_pd(pd);
    Ok(json!({
        "test": if ud { "ud_pingpong" } else { "rc_pingpong" },
        "role": if role == Role::Server { "server" } else { "client" },
        "size": size,
        "iters": iters,
        "bytes": bytes,
        "seconds": secs,
        "mbit_per_sec": bytes as f64 * 8.0 / usec,
        "usec_per_iter": usec / iters as f64,
        "local_qpn": me.qpn,
        "remote_qpn": peer.qpn,
    }))
}
