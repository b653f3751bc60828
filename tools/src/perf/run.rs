//! One perftest tool run from connection to close, following each tool's TCP sequence
//! (docs/perftest-protocol.md section 2), or with `-R` the same sequence over an rdma_cm
//! connection with the test's QPs connected by rdma_cm (section 10, [`super::cm`]), and
//! printing its output (section 6).

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use dataplane::Verbs;
use ferroce_host::app::RdmaCm;
use roce::verbs::{Mtu, RecvWr, SendFlags, SendWr, WcStatus, WrOp};
use serde_json::{json, Value};

use super::bw::{self, BwOut};
use super::cm::{self, ConnOpts, Local};
use super::lat;
use super::oob::{Key, Oob, Role, WireReport};
use super::report::{self, BwResult, LatResult, RULE};
use super::res::{local_mtu, port_facts, Res};
use super::{Conn, Kind, Params, Verb};

/// perftest's page-size cycle buffer and cache line (ours; the peer's may be larger).
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// How long a client keeps trying to reach a server that is not listening yet.
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// Where the out-of-band connection comes from.
pub enum Endpoint {
    /// Server: accept one client on this socket.
    Listen(TcpListener),
    /// Client: connect to this host and port.
    Connect(String, u16),
    /// `-R`: the exchange over an rdma_cm connection on a second context of the same RNIC:
    /// as client to `server` (the server RNIC's address), as server listening, on `port`.
    Cm {
        /// The server's address (client), or None (server).
        server: Option<Ipv4Addr>,
        /// The rdma_cm port (perftest's `-p`).
        port: u16,
        /// The exchange's own context.
        comm: CommCtx,
    },
}

/// Makes the `-R` exchange's connection (see [`cm::comm`]).
pub type CommCtx = Box<dyn FnOnce() -> Result<Box<dyn super::oob::Link>, String> + Send>;

/// `-R`'s state during a run: this side's address and the test's connections.
struct CmState {
    local: Local,
    /// RC: the connection of each QP, to disconnect at the end (none for UD).
    conns: Vec<u32>,
    port: u16,
    server: Option<Ipv4Addr>,
}

/// A test's machine-readable result.
pub type Outcome = Value;

fn mtu_bytes(m: Mtu) -> u32 {
    m.bytes()
}

/// `%#0Nx` as C prints it (0 has no "0x" prefix).
fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("0x{:0w$x}", v, w = width.saturating_sub(2))
    }
}

fn gid_line(g: &[u8; 16]) -> String {
    let parts: Vec<String> = g.iter().map(|b| format!("{b:02}")).collect();
    format!(" GID: {}", parts.join(":"))
}

fn addr_line(p: &Params, side: &str, k: &Key) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(k.lid as u64, 4),
        c_alt_hex(k.qpn as u64, 6),
        c_alt_hex(k.psn as u64, 6)
    );
    if p.verb == Verb::Read {
        s.push_str(&format!(" OUT {}", c_alt_hex(k.out_reads as u64, 4)));
    }
    if matches!(p.verb, Verb::Read | Verb::Write) {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            c_alt_hex(k.rkey as u64, 8),
            c_alt_hex(k.vaddr, 16)
        ));
    }
    s
}

fn header<V: Verbs>(p: &Params, r: &Res<V>, dev: &str) -> String {
    let mut h = Vec::new();
    h.push(RULE.to_string());
    h.push(format!("                    {}", p.title()));
    h.push(format!(" Dual-port       : OFF\t\tDevice         : {dev}"));
    h.push(format!(
        " Number of qps   : {}\t\tTransport type : IB",
        p.qps
    ));
    h.push(format!(
        " Connection type : {:?}\t\tUsing SRQ      : OFF",
        p.conn
    ));
    h.push(format!(
        " PCIe relax order: {}",
        if p.verb == Verb::Write && p.kind == Kind::Lat {
            "OFF"
        } else {
            "ON"
        }
    ));
    h.push(" ibv_wr* API     : OFF".into());
    if p.role == Role::Client || p.bidir {
        h.push(format!(" TX depth        : {}", p.tx_depth));
    }
    if p.verb == Verb::Send && (p.role == Role::Server || p.bidir || p.kind == Kind::Lat) {
        h.push(format!(" RX depth        : {}", p.rx_depth));
    }
    if p.kind == Kind::Bw {
        h.push(format!(" CQ Moderation   : {}", p.cq_mod));
    }
    h.push(format!(" Mtu             : {}[B]", mtu_bytes(r.mtu)));
    h.push(" Link type       : Ethernet".into());
    h.push(format!(" GID index       : {}", r.gid_index));
    if matches!(p.verb, Verb::Read | Verb::Atomic) {
        h.push(format!(" Outstand reads  : {}", r.out_reads));
    } else {
        h.push(format!(" Max inline data : {}[B]", p.inline));
    }
    if p.rdma_cm {
        // perftest's lines for -R (the server's note comes after the connections here too).
        h.push(" rdma_cm QPs\t : ON".into());
        let tos = if p.tos != 0 {
            format!(" \tTOS    : {}", p.tos)
        } else {
            String::new()
        };
        h.push(format!(" Data ex. method : rdma_cm{tos}"));
        if p.role == Role::Server {
            h.push(RULE.to_string());
            h.push(" Waiting for client rdma_cm QP to connect".into());
            h.push(" Please run the same command with the IB/RoCE interface IP".into());
        }
    } else {
        h.push(" rdma_cm QPs\t : OFF".into());
        h.push(" Data ex. method : Ethernet".into());
    }
    h.push(RULE.to_string());
    h.join("\n") + "\n"
}

/// Prints the server's waiting banner (before accept, as perftest does).
pub fn waiting_banner() -> &'static str {
    "\n************************************\n* Waiting for client to connect... *\n************************************\n"
}

struct Session<'a, V: Verbs> {
    p: &'a Params,
    oob: Oob,
    res: Res<V>,
    /// `-R`.
    cm: Option<CmState>,
    rem: Vec<Key>,
    out: &'a mut dyn Write,
    rows: Vec<Value>,
    verified: u64,
    /// UC/UD messages that never arrived (receiver side).
    lost: u64,
}

impl<V: Verbs + RdmaCm> Session<'_, V> {
    fn say(&mut self, s: &str) {
        // --output prints nothing but its figure.
        if self.p.output.is_none() {
            self.put(s);
        }
    }

    fn put(&mut self, s: &str) {
        let _ = self.out.write_all(s.as_bytes());
        let _ = self.out.flush();
    }

    fn round(&mut self, qp: usize) -> Result<Key, String> {
        let k = self.res.my_keys[qp];
        self.oob.keys(&k, self.res.gid_index)
    }

    /// Loop 1, connect, loop 2 (printing addresses). `mid_round`: one more round between
    /// connecting and loop 2 (ib_send_bw's order; the others have it after loop 2).
    fn pre_test(&mut self, to_rts: bool, per_qp: bool, mid_round: bool) -> Result<(), String> {
        let n = if per_qp { self.res.qps.len() } else { 1 };
        self.rem = Vec::with_capacity(n);
        for i in 0..n {
            let k = self.round(i)?;
            self.rem.push(k);
        }
        if self.cm.is_none() {
            check_gids(&self.res, &self.rem)?;
            let rem = self.rem.clone();
            self.res.connect(self.p, &rem, to_rts)?;
        }
        if mid_round {
            self.round(0)?;
        }
        let mut lines = String::new();
        for k in self.res.my_keys.clone() {
            lines += &format!("{}\n{}\n", addr_line(self.p, "local", &k), gid_line(&k.gid));
        }
        self.say(&lines);
        for i in 0..n {
            let k = self.round(i)?;
            if k != self.rem[i] {
                return Err("the peer changed its keys between rounds".into());
            }
            let l = format!(
                "{}\n{}\n",
                addr_line(self.p, "remote", &k),
                gid_line(&k.gid)
            );
            self.say(&l);
        }
        Ok(())
    }

    fn bw_table_header(&mut self) {
        let h = format!("{RULE}\n{}\n", report::bw_header(self.p.gbits));
        self.say(&h);
    }

    fn bw_row(&mut self, r: &BwResult) {
        let l = report::bw_line(r, self.p.gbits) + "\n";
        self.say(&l);
        match self.p.output {
            Some(super::Output::Bandwidth) => {
                let v = format!("{:.2}\n", report::bw_unit(r.avg_bps, self.p.gbits));
                self.put(&v);
            }
            Some(super::Output::MessageRate) => {
                let v = format!("{:.6}\n", r.msg_rate / 1e6);
                self.put(&v);
            }
            _ => {}
        }
        self.rows.push(report::bw_json(r));
    }

    fn lat_row(&mut self, r: &LatResult) {
        let mut s = String::new();
        if self.p.histogram {
            s += &report::histogram(r);
            s += &format!("{RULE}\n{}\n", report::lat_header());
        }
        s += &report::lat_line(r);
        s += "\n";
        self.say(&s);
        if self.p.output == Some(super::Output::Latency) {
            let v = format!("{:.2}\n", r.typical);
            self.put(&v);
        }
        self.rows.push(report::lat_json(r));
    }

    fn to_wire(&self, r: &BwResult) -> WireReport {
        WireReport {
            size: r.bytes,
            iters: r.iterations,
            bw_peak: report::bw_unit(r.peak_bps, self.p.gbits),
            bw_avg: report::bw_unit(r.avg_bps, self.p.gbits),
            msg_rate: r.msg_rate / 1e6,
        }
    }

    fn decode_report(&self, w: &WireReport) -> BwResult {
        let back = |v: f64| {
            if !v.is_finite() || v < 0.0 {
                0.0
            } else if self.p.gbits {
                v * 1e9 / 8.0
            } else {
                v * (1u64 << 20) as f64
            }
        };
        BwResult {
            bytes: w.size,
            iterations: w.iters,
            peak_bps: back(w.bw_peak),
            avg_bps: back(w.bw_avg),
            msg_rate: if w.msg_rate.is_finite() && w.msg_rate > 0.0 {
                w.msg_rate * 1e6
            } else {
                0.0
            },
        }
    }

    /// A bandwidth loop that SIGINT/SIGTERM ended early: prints the row for what completed
    /// and the closing rule, and returns the error that stops the test.
    fn stop_bw(&mut self, size: u64, mut o: BwOut, sender: bool) -> String {
        let n = o.sent as usize;
        o.tposted.truncate(n);
        o.tcompleted.truncate(n);
        let r = if o.tcompleted.is_empty() && o.sampled.is_none() {
            // Duration mode keeps no per-message times: the average over the time it ran.
            let n = if sender { o.sent } else { o.received };
            BwResult::new(size, n, o.elapsed_ns.max(1) as f64 / 1e9, 0.0)
        } else if sender {
            bw::sender_result(self.p, size, &o)
        } else {
            bw::receiver_result(size, &o)
        };
        self.bw_row(&r);
        self.say(&format!("{RULE}\n"));
        super::INTERRUPTED.into()
    }

    /// Ends one message size of a latency test: its row; or, when SIGINT/SIGTERM ended the
    /// loop early, the row for the iterations it measured, the closing rule and the error
    /// that stops the test.
    fn lat_size_done(&mut self, size: u64, o: &lat::LatOut, factor: f64) -> Result<(), String> {
        if o.interrupted {
            let n = o.tposted.len() as u64;
            if n >= 2 {
                let r = LatResult::perftest(size, n, &o.tposted, factor);
                self.lat_row(&r);
            }
            self.say(&format!("{RULE}\n"));
            return Err(super::INTERRUPTED.into());
        }
        self.verified += o.verified;
        let r = LatResult::perftest(size, self.p.iters, &o.tposted, factor);
        self.lat_row(&r);
        Ok(())
    }

    /// A latency test's table: the header, a row per message size (`before` runs ahead of
    /// each size's loop) and the closing rule.
    fn lat_table(
        &mut self,
        factor: f64,
        mut before: impl FnMut(&mut Self, u64) -> Result<(), String>,
    ) -> Result<(), String> {
        let h = format!("{RULE}\n{}\n", report::lat_header());
        self.say(&h);
        let p = self.p;
        for &size in &p.sizes {
            before(self, size)?;
            let rem = self.rem[0];
            let o = lat::run(&mut self.res, p, size, &rem)?;
            self.lat_size_done(size, &o, factor)?;
        }
        self.say(&format!("{RULE}\n"));
        Ok(())
    }

    fn close(mut self) -> Result<(Vec<Value>, u64, u64, Res<V>), String> {
        let k = self.res.my_keys[0];
        let gi = self.res.gid_index;
        let conns = self
            .cm
            .as_ref()
            .map(|c| c.conns.clone())
            .unwrap_or_default();
        let res = &mut self.res;
        // perftest's order: the closing round, the test's connections, then the exchange's.
        self.oob.close(&k, gi, || {
            cm::disconnect_all(&mut res.ctx, &conns, Duration::from_secs(2))
        })?;
        Ok((self.rows, self.verified, self.lost, self.res))
    }
}

fn check_gids<V: Verbs>(res: &Res<V>, rem: &[Key]) -> Result<(), String> {
    let mine = roce::types::Gid(res.gid.0).is_ipv4_mapped();
    for k in rem {
        if roce::types::Gid(k.gid).is_ipv4_mapped() != mine {
            return Err(
                "the peer's GID and ours are not both IPv4-mapped (choose matching -x)".into(),
            );
        }
    }
    Ok(())
}

fn sum_results(a: &BwResult, b: &BwResult) -> BwResult {
    BwResult {
        bytes: a.bytes,
        iterations: a.iterations,
        peak_bps: a.peak_bps + b.peak_bps,
        avg_bps: a.avg_bps + b.avg_bps,
        msg_rate: a.msg_rate + b.msg_rate,
    }
}

/// Runs one perftest tool on `ctx`. Human output goes to `out`; the result comes back as JSON.
pub fn run<V: Verbs + RdmaCm>(
    mut ctx: V,
    p: &Params,
    endpoint: Endpoint,
    dev: &str,
    out: &mut dyn Write,
) -> Result<Outcome, String> {
    let facts = port_facts(&mut ctx, p)?;
    let mtu_local = local_mtu(p, &facts);
    let mut cm_state = None;
    if p.rdma_cm != matches!(endpoint, Endpoint::Cm { .. }) {
        return Err("-R and the exchange's endpoint disagree (internal error)".into());
    }
    let oob = match endpoint {
        Endpoint::Cm { server, port, comm } => {
            if server.is_none() && p.output.is_none() {
                let _ = out.write_all(waiting_banner().as_bytes());
                let _ = out.flush();
            }
            // The test's address: the GID the port facts chose when it is an IPv4 one.
            let local = if facts.gid.is_ipv4_mapped() {
                Local {
                    gid: facts.gid,
                    gid_index: facts.gid_index,
                }
            } else {
                Local::of(&mut ctx)?
            };
            let link = comm()?;
            cm_state = Some(CmState {
                local,
                conns: Vec::new(),
                port,
                server,
            });
            Oob::from_link(link, p.role)
        }
        Endpoint::Listen(l) => {
            if p.output.is_none() {
                let _ = out.write_all(waiting_banner().as_bytes());
            }
            let _ = out.flush();
            Oob::accept(l).map_err(|e| format!("accept: {e}"))?
        }
        Endpoint::Connect(host, port) => Oob::connect(&host, port, CONNECT_PATIENCE)
            .map_err(|e| format!("Couldn't connect to {host}:{port}: {e}"))?,
    };
    let mut oob = oob;
    let (_ver, cb, cl, mtu_agreed) = oob.negotiate(CYCLE_BUFFER, CACHE_LINE, mtu_local as u32)?;
    let mtu = Mtu::from_ibv(mtu_agreed).ok_or("bad agreed MTU")?;
    let mut p = p.clone();
    if p.conn == Conn::UD {
        // UD messages fit one packet (section 1.3).
        let max = mtu.bytes() as u64;
        if p.sizes.iter().any(|&s| s > max) {
            // perftest's notice, word for word.
            let _ = writeln!(
                out,
                " Max msg size in UD is MTU {max}\n Changing to this MTU"
            );
        }
        p.sizes = p.sizes.iter().map(|&s| s.min(max)).collect();
        p.sizes.dedup();
        p.max_size = p.max_size.min(max);
    }
    let p = &p;
    let mut res = Res::create(ctx, p, &facts, cb as u64, cl as u64, mtu)?;
    if let Some(c) = &cm_state {
        if p.conn == Conn::UD {
            // rdma_cm's UD QPs use its Q_Key, which the SIDR_REP names.
            res.qkey = roce::wire::cm::RDMA_UDP_QKEY;
        }
        res.gid = c.local.gid;
        res.gid_index = c.local.gid_index;
        for k in &mut res.my_keys {
            k.gid = c.local.gid.0;
        }
    }
    if p.output.is_none() {
        let _ = out.write_all(header(p, &res, dev).as_bytes());
    }
    let mut s = Session {
        p,
        oob,
        res,
        cm: cm_state,
        rem: Vec::new(),
        out,
        rows: Vec::new(),
        verified: 0,
        lost: 0,
    };
    if s.cm.is_some() {
        cm_connect(&mut s)?;
    }
    let result = match (p.kind, p.verb) {
        (Kind::Bw, Verb::Send) => send_bw(&mut s),
        (Kind::Bw, _) if p.write_imm => send_bw(&mut s),
        (Kind::Bw, _) => rdma_bw(&mut s),
        (Kind::Lat, Verb::Write) => write_lat(&mut s),
        (Kind::Lat, Verb::Send) => send_lat(&mut s),
        (Kind::Lat, _) => rd_atomic_lat(&mut s),
    };
    let (rows, verified, lost, res) = match result {
        Ok(None) => {
            // write_lat: no closing exchange (with -R the connections end all the same).
            if let Some(c) = &s.cm {
                cm::disconnect_all(&mut s.res.ctx, &c.conns, Duration::from_secs(2));
            }
            let rows = std::mem::take(&mut s.rows);
            (rows, s.verified, s.lost, s.res)
        }
        Ok(Some(())) => s.close()?,
        Err(e) => {
            // What was measured before the end goes out with the error (--json).
            if !s.rows.is_empty() || e == super::INTERRUPTED {
                let role = if p.role == Role::Server {
                    "server"
                } else {
                    "client"
                };
                super::keep_partial(
                    role,
                    json!({
                        "test": p.name(),
                        "role": role,
                        "results": std::mem::take(&mut s.rows),
                        "verified_messages": s.verified,
                        "lost_messages": s.lost,
                        "interrupted": e == super::INTERRUPTED,
                    }),
                );
            }
            return Err(e);
        }
    };
    let mine = res.my_keys.clone();
    res.destroy();
    Ok(json!({
        "test": p.name(),
        "role": if p.role == Role::Server { "server" } else { "client" },
        "connection": format!("{:?}", p.conn),
        "mtu": mtu.bytes(),
        "qps": p.qps,
        "tx_depth": p.tx_depth,
        "cq_mod": p.cq_mod,
        "local_qpns": mine.iter().map(|k| k.qpn).collect::<Vec<_>>(),
        "results": rows,
        "verified_messages": verified,
        "lost_messages": lost,
    }))
}

/// `-R`: perftest's `create_rdma_cm_connection`: a key round (the keys are still zero then),
/// the test's QPs connected by rdma_cm, another round. The server listens before the first
/// round (see [`super::cm`]) and takes the requests in the order they come, QP by QP.
fn cm_connect<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<(), String> {
    use roce::wire::cm::{service_id, PS_TCP, PS_UDP};
    let p = s.p;
    let Some(c) = s.cm.as_ref() else {
        return Ok(());
    };
    let (port, server) = (c.port, c.server);
    let sid = service_id(if p.conn == Conn::UD { PS_UDP } else { PS_TCP }, port);
    let gi = s.res.gid_index;
    if server.is_none() {
        s.res
            .ctx
            .cm_listen(sid)
            .map_err(|e| format!("rdma_listen on port {port}: {e}"))?;
    }
    let r = s
        .oob
        .keys(&Key::default(), gi)
        .and_then(|_| cm_connect_qps(s));
    if server.is_none() {
        let _ = s.res.ctx.cm_unlisten(sid);
    }
    let conns = r?;
    if let Some(c) = s.cm.as_mut() {
        c.conns = conns;
    }
    s.oob.keys(&Key::default(), gi)?;
    Ok(())
}

/// How long a server waits for the client's next request once the first round is done.
const CM_ACCEPT_WAIT: Duration = Duration::from_secs(60);
/// `wr_id` of the UD message that carries the client's QPN (perftest's `wr_id` 0 is ours
/// for data, so a distinct one).
const QPN_MSG: u64 = u64::MAX - 1;

/// Connects each test QP (RC: a connection each; UD: a SIDR exchange each, and for latency
/// and bidirectional tests the client's QPN in a SEND with immediate, as perftest sends it).
/// Returns the RC connections.
fn cm_connect_qps<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<Vec<u32>, String> {
    let p = s.p;
    let c = s.cm.as_ref().ok_or("-R state")?;
    let (local, port, server) = (c.local, c.port, c.server);
    let rd = if matches!(p.verb, Verb::Read | Verb::Atomic) {
        s.res.out_reads
    } else {
        0
    };
    let opts = ConnOpts {
        responder_resources: rd,
        initiator_depth: rd,
        retry_count: 7,
        rnr_retry_count: 7,
        timeout: p.qp_timeout,
        mtu: s.res.mtu,
    };
    let n = s.res.qps.len();
    let mut conns = Vec::new();
    if p.conn == Conn::UD {
        // UD QPs go to RTS on their own (librdmacm's rdma_create_qp does it for a UD ID).
        let none = vec![Key::default(); n];
        s.res.connect(p, &none, true)?;
    }
    let qpn_msg = p.conn == Conn::UD && (p.kind == Kind::Lat || p.bidir);
    for i in 0..n {
        let qpn = s.res.qps[i];
        // The UD QPN message's place: this QP's local slot.
        let slot = s.res.local_off(i);
        let ctx = &mut s.res.ctx;
        match (p.conn, server) {
            (Conn::UD, Some(ip)) => {
                let c = cm::sidr_resolve(ctx, &local, ip, port, CONNECT_PATIENCE)?;
                if qpn_msg {
                    let sge = s.res.mr.sge(slot, 4);
                    let dest = cm::ud_dest(&local, roce::types::Gid::from_ipv4(ip.octets()), &c);
                    let wr = SendWr {
                        wr_id: QPN_MSG,
                        op: WrOp::SendWithImm { imm: qpn.value() },
                        sg_list: &[sge],
                        flags: SendFlags::SIGNALED,
                        ud: Some(dest),
                    };
                    s.res
                        .ctx
                        .post_send(qpn, &wr)
                        .map_err(|e| format!("-R: send my QPN: {e}"))?;
                    let wc = cm::poll_one(&mut s.res.ctx, s.res.scq, Some(CM_ACCEPT_WAIT))
                        .map_err(|e| format!("-R: send my QPN: {e}"))?;
                    if wc.status != WcStatus::Success {
                        return Err(format!("-R: send my QPN: {:?}", wc.status));
                    }
                }
            }
            (Conn::UD, None) => {
                let sge = s.res.mr.sge(slot, cm::qpn_msg_len());
                cm::sidr_answer(&mut s.res.ctx, qpn, CM_ACCEPT_WAIT, |ctx| {
                    if !qpn_msg {
                        return Ok(());
                    }
                    ctx.post_recv(
                        qpn,
                        &RecvWr {
                            wr_id: QPN_MSG,
                            sg_list: &[sge],
                        },
                    )
                    .map_err(|e| format!("-R: receive the client's QPN: {e}"))
                })?;
                if qpn_msg {
                    let wc = cm::poll_one(&mut s.res.ctx, s.res.rcq, Some(CM_ACCEPT_WAIT))
                        .map_err(|e| format!("-R: receive the client's QPN: {e}"))?;
                    if wc.status != WcStatus::Success || wc.wr_id != QPN_MSG {
                        return Err(format!("-R: receive the client's QPN: {:?}", wc.status));
                    }
                }
            }
            (_, Some(ip)) => {
                let c = cm::connect_rc(ctx, &local, qpn, ip, port, &opts, CONNECT_PATIENCE)?;
                s.res.my_keys[i].psn = c.sq_psn;
                conns.push(c.id);
            }
            (_, None) => {
                let c = cm::accept_rc(ctx, &local, qpn, &opts, CM_ACCEPT_WAIT)?;
                s.res.my_keys[i].psn = c.sq_psn;
                conns.push(c.id);
            }
        }
    }
    Ok(conns)
}

/// write/read/atomic bandwidth (and WRITE with immediate goes through `send_bw`).
fn rdma_bw<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<Option<()>, String> {
    let p = s.p;
    let duplex = p.bidir;
    s.pre_test(p.role == Role::Client || duplex, true, false)?;
    if p.verify && p.role == Role::Server {
        bw::prepare_region(&s.res, p);
    }
    s.round(0)?; // after RTR
    s.bw_table_header();
    if duplex {
        for &size in &p.sizes.clone() {
            s.round(0)?;
            let rem = s.rem.clone();
            let o = bw::run(&mut s.res, p, size, &rem, true, false, &mut || false)?;
            if o.interrupted {
                return Err(s.stop_bw(size, o, true));
            }
            s.verified += o.verified;
            let mine = bw::sender_result(p, size, &o);
            let w = s.to_wire(&mine);
            let theirs = s.oob.reports(&w)?;
            let theirs = s.decode_report(&theirs);
            s.bw_row(&sum_results(&mine, &theirs));
        }
        return Ok(Some(()));
    }
    let mut last = BwResult::new(0, 0, 1.0, 0.0);
    if p.role == Role::Client && p.run_infinitely {
        // A row every -D seconds until SIGINT/SIGTERM (perftest's --run_infinitely).
        let size = p.sizes[0];
        loop {
            let rem = s.rem.clone();
            let o = bw::run(&mut s.res, p, size, &rem, true, false, &mut || false)?;
            if o.interrupted {
                return Err(s.stop_bw(size, o, true));
            }
            let r = bw::sender_result(p, size, &o);
            s.bw_row(&r);
        }
    }
    if p.role == Role::Client {
        for &size in &p.sizes.clone() {
            let rem = s.rem.clone();
            let o: BwOut = bw::run(&mut s.res, p, size, &rem, true, false, &mut || false)?;
            if o.interrupted {
                return Err(s.stop_bw(size, o, true));
            }
            s.verified += o.verified;
            last = bw::sender_result(p, size, &o);
            s.bw_row(&last);
        }
    }
    if p.role == Role::Server && p.run_infinitely {
        // The client runs until it is stopped; its connection closing ends the server.
        return match s.round(0) {
            Err(e) if e.contains("closed") => {
                s.say(&format!("{RULE}\n"));
                Ok(None)
            }
            Err(e) => Err(e),
            Ok(_) => Err("--run_infinitely: the client ended the test unexpectedly".into()),
        };
    }
    s.round(0)?; // post-test sync: the client has every completion
    if p.verify && p.role == Role::Server && p.verb == Verb::Write {
        let size = p.sizes[0];
        let (mut verified, mut lost) = bw::verify_write_region(&s.res, p.conn, size, p.iters)?;
        // A UC WRITE completes at the client once sent, so the post-test sync can overtake
        // WRITEs still queued in either RNIC (a busy rnicd, found by the real soak): while
        // messages are missing, wait as long as the region keeps filling.
        let mut changed = Instant::now();
        while lost > 0 && changed.elapsed() < Duration::from_millis(300) {
            std::thread::sleep(Duration::from_millis(20));
            let (v, l) = bw::verify_write_region(&s.res, p.conn, size, p.iters)?;
            if v != verified {
                changed = Instant::now();
            }
            (verified, lost) = (v, l);
        }
        s.verified += verified;
        s.lost += lost;
        if lost > 0 {
            eprintln!(" {lost} UC WRITEs did not arrive whole (a lossy link), the rest verified");
        }
    }
    // The server's report is not computed (perftest sends stack garbage; we send zeros).
    let w = if p.role == Role::Client {
        s.to_wire(&last)
    } else {
        WireReport::default()
    };
    let theirs = s.oob.reports(&w)?;
    if p.role == Role::Server {
        let r = s.decode_report(&theirs);
        s.bw_row(&r);
    }
    s.say(&format!("{RULE}\n"));
    Ok(Some(()))
}

/// SEND bandwidth (and WRITE with immediate, whose server consumes receives the same way).
fn send_bw<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<Option<()>, String> {
    let p = s.p;
    let duplex = p.bidir;
    // The round after RTR comes before the remote addresses here (perftest's send_bw).
    s.pre_test(p.role == Role::Client || duplex, true, true)?;
    s.bw_table_header();
    let receiver = p.role == Role::Server || duplex;
    let sender = p.role == Role::Client || duplex;
    let all = p.sizes.len() > 1;
    for &size in &p.sizes.clone() {
        if receiver {
            bw::prepost_recvs(&mut s.res, p, size)?;
        }
        s.round(0)?; // the client will not send before the server posted its receives
        let rem = s.rem.clone();
        let oob = &mut s.oob;
        let o = bw::run(&mut s.res, p, size, &rem, sender, receiver, &mut || {
            oob.peer_has_data()
        })?;
        if o.interrupted {
            return Err(s.stop_bw(size, o, sender));
        }
        s.verified += o.verified;
        s.lost += o.lost;
        if o.lost > 0 {
            // Worded like perftest's server when its watchdog gives up.
            eprintln!(
                " {} messages did not arrive (the sender finished; UC/UD drop what finds no receive WQE), exiting..\n Total Received={}, Total Iters Required={}",
                o.lost,
                o.received,
                o.received + o.lost
            );
        }
        let mine = if sender {
            bw::sender_result(p, size, &o)
        } else {
            bw::receiver_result(size, &o)
        };
        if duplex && p.duration.is_none() {
            let w = s.to_wire(&mine);
            let theirs = s.oob.reports(&w)?;
            let theirs = s.decode_report(&theirs);
            s.bw_row(&sum_results(&mine, &theirs));
        } else {
            s.bw_row(&mine);
        }
        if all {
            s.round(0)?;
        }
    }
    s.say(&format!("{RULE}\n"));
    Ok(Some(()))
}

/// `ib_write_lat`: four rounds, the ping-pong, no closing exchange.
fn write_lat<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<Option<()>, String> {
    let p = s.p;
    s.round(0)?; // the first handshake
    s.pre_test(true, false, false)?;
    s.round(0)?; // after RTR
    s.lat_table(2.0, |_, _| Ok(()))?;
    // ib_write_lat ends without a closing exchange: each side stops after its own last
    // WRITE completed and the peer's last WRITE arrived. If the ACK of the peer's last WRITE
    // was lost, the peer retransmits it after its ACK timeout, and a QP destroyed by then
    // leaves it to fail with RETRY_EXC_ERR (seen by the real soak over a lossy link). Keep
    // the QP for three of the peer's ACK timeouts (the same -u on both sides), at most 1 s.
    let ack_timeout_ns = 4096u64 << p.qp_timeout.min(31);
    std::thread::sleep(Duration::from_nanos(
        ack_timeout_ns.saturating_mul(3).min(1_000_000_000),
    ));
    Ok(None)
}

/// `ib_read_lat` / `ib_atomic_lat`: four rounds; the client measures, the server waits in the
/// closing round.
fn rd_atomic_lat<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<Option<()>, String> {
    let p = s.p;
    s.round(0)?;
    s.pre_test(true, false, false)?;
    if p.verify && p.role == Role::Server {
        bw::prepare_region(&s.res, p);
    }
    s.round(0)?;
    if p.role == Role::Server {
        s.say(&format!("{RULE}\n"));
        return Ok(Some(()));
    }
    s.lat_table(1.0, |_, _| Ok(()))?;
    Ok(Some(()))
}

/// `ib_send_lat`: three rounds, then per size receives and a sync round, the ping-pong.
fn send_lat<V: Verbs + RdmaCm>(s: &mut Session<'_, V>) -> Result<Option<()>, String> {
    let p = s.p;
    s.pre_test(true, false, true)?;
    s.lat_table(2.0, |s, size| {
        bw::prepost_recvs(&mut s.res, p, size)?;
        s.round(0)?;
        Ok(())
    })?;
    Ok(Some(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_lines_match_perftest() {
        let k = Key {
            lid: 0,
            out_reads: 1,
            qpn: 0x2b,
            psn: 0x1897e5,
            rkey: 0x7e7,
            vaddr: 0x55a39e986000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 99, 0, 4],
            srqn: 0,
        };
        let a = super::super::PerfArgs {
            server: None,
            size: None,
            all: false,
            iters: None,
            duration: None,
            qps: 1,
            tx_depth: None,
            rx_depth: None,
            cq_mod: None,
            post_list: 1,
            mtu: None,
            conn: Conn::RC,
            bidir: false,
            gid_index: None,
            tcp_port: 18515,
            qp_timeout: 14,
            atomic: super::super::AtomicType::FETCH_AND_ADD,
            outs: None,
            report_gbits: false,
            write_with_imm: false,
            histogram: false,
            cpu_freq: false,
            ib_dev: None,
            ib_port: 1,
            inline: None,
            verify: false,
            json: false,
            baseline: false,
            tos: None,
            sl: 0,
            no_peak: false,
            version: false,
            output: None,
            ipv6: false,
            use_old_post_send: false,
            run_infinitely: false,
            events: false,
            rdma_cm: false,
        };
        let p = Params::from_args(Verb::Write, Kind::Bw, &a).unwrap();
        assert_eq!(
            addr_line(&p, "local", &k),
            " local address: LID 0000 QPN 0x002b PSN 0x1897e5 RKey 0x0007e7 VAddr 0x0055a39e986000"
        );
        assert_eq!(
            gid_line(&k.gid),
            " GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:00:04"
        );
        let ps = Params::from_args(Verb::Send, Kind::Lat, &a).unwrap();
        assert_eq!(
            addr_line(&ps, "remote", &k),
            " remote address: LID 0000 QPN 0x002b PSN 0x1897e5"
        );
    }
}
