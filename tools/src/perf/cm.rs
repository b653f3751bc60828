//! perftest's `-R` (docs/perftest-protocol.md section 10): the test's QPs are connected by
//! rdma_cm (IB CM over QP1 with rdma_cm's addressing, through the RNIC's connection
//! manager), and the exchange that runs over TCP otherwise runs over an rdma_cm connection of
//! its own: one RC QP on a second context, each item one SEND ([`CmLink`]).
//!
//! The sequence is perftest 4.5's: the server listens on the `-p` port (port space TCP),
//! takes one connection for the exchange and stops listening; after the usual negotiation a
//! key round, then the client connects each test QP to the same port (port space TCP for RC,
//! UDP with SIDR for UD) and the server accepts them in the order they come; another key
//! round; then the test as without `-R`, minus the QP transitions the CM already made. At
//! the end the client disconnects each test connection (DREQ), then the exchange's.
//!
//! One difference keeps a race away: perftest's server starts listening for the test QPs only
//! after its key round, so a client that is quick gets a reject ("invalid service ID") and
//! must start again; rnic-perf's server listens before the round, and rnic-perf's client
//! tries again on that reject (perftest's client tries 10 times, 100 ms apart).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce_host::abi::CmEventData;
use ferroce_host::app::{Buffer, CmQpPath, Mr, RdmaCm, Verbs};
use roce::cm::{reason, AcceptParams, ConnectParams, SidrParams, SIDR_UNSUPPORTED, SIDR_VALID};
use roce::engine::{CqId, QpInit, VerbsResult};
use roce::memory::PdId;
use roce::types::{Gid, Qkey, Qpn};
use roce::verbs::{
    Access, AddressVector, Completion, Mtu, QpCaps, QpType, RecvWr, SendFlags, SendWr, UdDest,
    WcOpcode, WcStatus, WrOp,
};
use roce::wire::cm::{service_id, CmaHeader, PrivateData, PS_TCP, PS_UDP, RDMA_UDP_QKEY};

use super::res::random_psn;

/// How long one CM step may take before the test gives up: longer than the CM's own retries
/// (a REQ is sent 16 times, 2 x packet lifetime + response timeout apart, about 98 s, before
/// the CM reports a timeout), so that its `TimedOut` is what ends a step.
const STEP: Duration = Duration::from_secs(120);
/// Pause before trying a connection again after "nobody listens" (perftest's 100 ms).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// What a SEND of the exchange may hold (`struct pingpong_dest`, the largest item, is 56).
const SLOT: usize = 64;

/// This side's address on the RNIC: its IPv4-mapped GID and that GID's index.
#[derive(Debug, Clone, Copy)]
pub struct Local {
    /// The GID (IPv4-mapped).
    pub gid: Gid,
    /// Its index.
    pub gid_index: u8,
}

impl Local {
    /// The context's first IPv4-mapped GID (rdma_cm here addresses peers by IPv4).
    pub fn of<V: Verbs>(ctx: &mut V) -> Result<Local, String> {
        let port = ctx.query_port().map_err(|e| format!("query port: {e}"))?;
        let (gid_index, gid) = super::res::first_ipv4_gid(ctx, port.gid_tbl_len)
            .ok_or("-R: the RNIC has no IPv4 address for rdma_cm")?;
        Ok(Local { gid, gid_index })
    }

    fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.gid.to_ipv4().unwrap_or([0; 4]))
    }
}

/// The server's RNIC address as the client names it: an IPv4 address or a name that
/// resolves to one.
pub fn resolve(host: &str) -> Result<Ipv4Addr, String> {
    use std::net::ToSocketAddrs;
    let addrs = (host, 0)
        .to_socket_addrs()
        .map_err(|e| format!("-R: cannot resolve {host}: {e}"))?;
    for a in addrs {
        if let SocketAddr::V4(v4) = a {
            return Ok(*v4.ip());
        }
    }
    Err(format!("-R: {host} has no IPv4 address"))
}

/// What a connection is made with (perftest's `rdma_conn_param` and QP timeout).
#[derive(Debug, Clone, Copy)]
pub struct ConnOpts {
    /// READ/atomic requests this side answers at once (0 unless the test reads or does
    /// atomics, as perftest sets it).
    pub responder_resources: u8,
    /// READ/atomic requests this side issues at once.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Path MTU this side offers (the port's, or less).
    pub mtu: Mtu,
}

/// A connection the CM made: its ID and the PSN this side's requests start from.
#[derive(Debug, Clone, Copy)]
pub struct Connected {
    /// The connection's ID.
    pub id: u32,
    /// Where this QP's requests start.
    pub sq_psn: u32,
    /// The peer's QP.
    pub peer_qpn: Qpn,
    /// The peer's Q_Key (UD).
    pub peer_qkey: u32,
}

/// The next CM event `want` accepts, waiting up to `timeout` and stopping on
/// SIGINT/SIGTERM. Others are passed over: those of connections made before (a passive side
/// hears `Established` when the RTU comes, an active one after sending it) and of
/// connections that ended.
pub fn next_event<V: RdmaCm>(
    ctx: &mut V,
    what: &str,
    timeout: Duration,
    want: impl Fn(&CmEventData) -> bool,
) -> Result<CmEventData, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if super::interrupted() {
            return Err(super::INTERRUPTED.into());
        }
        let slice = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(200));
        if let Some(e) = ctx
            .cm_wait_event(slice)
            .map_err(|e| format!("{what}: {e}"))?
        {
            if want(&e) {
                return Ok(e);
            }
            continue;
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: no answer in {} s", timeout.as_secs()));
        }
    }
}

/// rdma_cm's private data of a request from `local` (an ephemeral source port) to `dst`.
fn request_private<const N: usize>(local: &Local, dst: Ipv4Addr) -> PrivateData<N> {
    let port = 0xc000 | (random_psn() as u16 & 0x3fff);
    let hdr = CmaHeader {
        src: SocketAddr::new(local.ip().into(), port),
        dst: dst.into(),
    };
    // Both IPv4, and no user bytes: it always fits.
    hdr.private_data(&[]).unwrap_or_default()
}

/// The active side of an RC connection from `qpn` (in RESET) to `dst`:`port`: the REQ, then
/// on the REP the QP through INIT, RTR and RTS and the RTU. A reject because nobody listens
/// yet, or a REQ that timed out, is tried again until `patience` has passed.
pub fn connect_rc<V: RdmaCm>(
    ctx: &mut V,
    local: &Local,
    qpn: Qpn,
    dst: Ipv4Addr,
    port: u16,
    o: &ConnOpts,
    patience: Duration,
) -> Result<Connected, String> {
    let remote_gid = Gid::from_ipv4(dst.octets());
    retrying("rdma_connect", patience, || {
        let rq_psn = random_psn();
        let params = ConnectParams {
            service_id: service_id(PS_TCP, port),
            local_gid: local.gid,
            remote_gid,
            qpn: qpn.value(),
            starting_psn: rq_psn,
            responder_resources: o.responder_resources,
            initiator_depth: o.initiator_depth,
            path_mtu: o.mtu as u8,
            retry_count: o.retry_count.min(7),
            rnr_retry_count: o.rnr_retry_count.min(7),
            hop_limit: 64,
            private_data: request_private(local, dst),
            ..Default::default()
        };
        let (id, answer) = request(ctx, "rdma_connect", dst, port, |c| c.cm_connect(params))?;
        let again = match answer {
            CmEventData::RepReceived {
                qpn: peer_qpn,
                starting_psn,
                responder_resources,
                rnr_retry_count,
                ..
            } => {
                let path = CmQpPath {
                    peer_gid: remote_gid,
                    sgid_index: local.gid_index,
                    peer_qpn,
                    path_mtu: o.mtu,
                    rq_psn,
                    sq_psn: starting_psn,
                    max_rd_atomic: o.initiator_depth.min(responder_resources),
                    max_dest_rd_atomic: o.responder_resources,
                    retry_cnt: o.retry_count.min(7),
                    rnr_retry: rnr_retry_count.min(7),
                    timeout: o.timeout,
                };
                ctx.cm_bring_up(qpn, Access::ALL, &path)
                    .map_err(|e| format!("rdma_connect: QP {} to RTS: {e}", qpn.value()))?;
                ctx.cm_rtu(id)
                    .map_err(|e| format!("rdma_connect: RTU: {e}"))?;
                next_event(
                    ctx,
                    "rdma_connect",
                    STEP,
                    |e| matches!(e, CmEventData::Established { id: x } if *x == id),
                )?;
                return Ok(Ok(Connected {
                    id,
                    sq_psn: starting_psn,
                    peer_qpn,
                    peer_qkey: 0,
                }));
            }
            CmEventData::Rejected { reason: r, .. } if r == reason::INVALID_SERVICE_ID => {
                format!("{dst}:{port} does not listen")
            }
            CmEventData::Rejected { reason: r, .. } => {
                return Err(format!(
                    "rdma_connect to {dst}:{port}: rejected (reason {r})"
                ))
            }
            e => no_answer("rdma_connect", dst, port, e)?,
        };
        Ok(Err(again))
    })
}

/// Sends an active side's request with `send` (which gives its ID) to `dst`:`port` and waits
/// for the event that answers it.
fn request<V: RdmaCm>(
    ctx: &mut V,
    what: &str,
    dst: Ipv4Addr,
    port: u16,
    send: impl FnOnce(&mut V) -> VerbsResult<u32>,
) -> Result<(u32, CmEventData), String> {
    let id = send(ctx).map_err(|e| format!("{what} to {dst}:{port}: {e}"))?;
    Ok((id, next_event(ctx, what, STEP, |e| e.id() == id)?))
}

/// An answer to an active side's request that none of its cases took: none at all (the
/// request timed out) is tried again (`Ok(why)`); anything else fails.
fn no_answer(what: &str, dst: Ipv4Addr, port: u16, e: CmEventData) -> Result<String, String> {
    match e {
        CmEventData::TimedOut { .. } => Ok(format!("{dst}:{port} did not answer")),
        e => Err(format!("{what}: unexpected event {e:?}")),
    }
}

/// Runs `attempt` until it gives a result or fails for good; an attempt that asks to be
/// tried again (`Ok(Err(why))`: nobody listens yet, no answer) is, after
/// [`RETRY_PAUSE`], until `patience` has passed.
fn retrying<T>(
    what: &str,
    patience: Duration,
    mut attempt: impl FnMut() -> Result<Result<T, String>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + patience;
    loop {
        match attempt()? {
            Ok(t) => return Ok(t),
            Err(why) if Instant::now() >= deadline => return Err(format!("{what}: {why}")),
            Err(_) => std::thread::sleep(RETRY_PAUSE),
        }
    }
}

/// The passive side: the next REQ for a service this context listens to, answered for `qpn`
/// (in RESET): the QP through INIT, RTR and RTS, then the REP.
pub fn accept_rc<V: RdmaCm>(
    ctx: &mut V,
    local: &Local,
    qpn: Qpn,
    o: &ConnOpts,
    timeout: Duration,
) -> Result<Connected, String> {
    let want = |e: &CmEventData| matches!(e, CmEventData::ConnectRequest { .. });
    let req = next_event(ctx, "waiting for a connect request", timeout, want)?;
    let CmEventData::ConnectRequest {
        id,
        peer,
        qpn: peer_qpn,
        starting_psn: sq_psn,
        path_mtu: req_mtu,
        retry_count: retry,
        rnr_retry_count: rnr,
        ..
    } = req
    else {
        return Err(format!("waiting for a connect request: got {req:?}"));
    };
    let path_mtu = match Mtu::from_ibv(req_mtu as u32) {
        Some(m) if (m as u32) < (o.mtu as u32) => m,
        _ => o.mtu,
    };
    let rq_psn = random_psn();
    let path = CmQpPath {
        peer_gid: peer,
        sgid_index: local.gid_index,
        peer_qpn,
        path_mtu,
        rq_psn,
        sq_psn,
        max_rd_atomic: o.initiator_depth,
        max_dest_rd_atomic: o.responder_resources,
        retry_cnt: retry.min(7),
        rnr_retry: rnr.min(7),
        timeout: o.timeout,
    };
    if let Err(e) = ctx.cm_bring_up(qpn, Access::ALL, &path) {
        let _ = ctx.cm_reject(id, &[]);
        return Err(format!("rdma_accept: QP {} to RTS: {e}", qpn.value()));
    }
    let params = AcceptParams {
        qpn: qpn.value(),
        starting_psn: rq_psn,
        responder_resources: o.responder_resources,
        initiator_depth: o.initiator_depth,
        rnr_retry_count: o.rnr_retry_count.min(7),
        ..Default::default()
    };
    ctx.cm_accept(id, params)
        .map_err(|e| format!("rdma_accept: {e}"))?;
    Ok(Connected {
        id,
        sq_psn,
        peer_qpn,
        peer_qkey: 0,
    })
}

/// The active side of a UD service (rdma_cm's UDP port space): a SIDR request to
/// `dst`:`port`; the answer names the peer's QP and Q_Key. "Not supported" (nobody listens
/// yet) and no answer are tried again until `patience` has passed.
pub fn sidr_resolve<V: RdmaCm>(
    ctx: &mut V,
    local: &Local,
    dst: Ipv4Addr,
    port: u16,
    patience: Duration,
) -> Result<Connected, String> {
    retrying("rdma_connect (UD)", patience, || {
        let params = SidrParams {
            service_id: service_id(PS_UDP, port),
            local_gid: local.gid,
            remote_gid: Gid::from_ipv4(dst.octets()),
            private_data: request_private(local, dst),
        };
        let (id, answer) = request(ctx, "rdma_connect (UD)", dst, port, |c| {
            c.cm_sidr_request(params)
        })?;
        let again = match answer {
            CmEventData::SidrReply {
                status: SIDR_VALID,
                qpn,
                qkey,
                ..
            } => {
                return Ok(Ok(Connected {
                    id,
                    sq_psn: 0,
                    peer_qpn: qpn,
                    peer_qkey: qkey,
                }));
            }
            CmEventData::SidrReply {
                status: SIDR_UNSUPPORTED,
                ..
            } => format!("{dst}:{port} does not listen"),
            CmEventData::SidrReply { status, .. } => {
                return Err(format!(
                    "rdma_connect (UD) to {dst}:{port}: refused (status {status})"
                ))
            }
            e => no_answer("rdma_connect (UD)", dst, port, e)?,
        };
        Ok(Err(again))
    })
}

/// The passive side of a UD service: the next SIDR request, answered with `qpn` and
/// rdma_cm's Q_Key. `before_reply` runs between the request and the answer (perftest posts
/// the receive that takes the client's QPN there). Returns the requester's GID.
pub fn sidr_answer<V: RdmaCm>(
    ctx: &mut V,
    qpn: Qpn,
    timeout: Duration,
    before_reply: impl FnOnce(&mut V) -> Result<(), String>,
) -> Result<Gid, String> {
    let want = |e: &CmEventData| matches!(e, CmEventData::SidrRequest { .. });
    let (id, peer) = match next_event(ctx, "waiting for a UD connect request", timeout, want)? {
        CmEventData::SidrRequest { id, peer, .. } => (id, peer),
        e => return Err(format!("waiting for a UD connect request: got {e:?}")),
    };
    before_reply(ctx)?;
    ctx.cm_sidr_reply(id, SIDR_VALID, qpn.value(), RDMA_UDP_QKEY, &[])
        .map_err(|e| format!("rdma_accept (UD): {e}"))?;
    Ok(peer)
}

/// Disconnects `ids` (DREQ) and waits, up to `timeout` in all, until each has reported
/// `Disconnected` (a connection the peer ended first already has).
pub fn disconnect_all<V: RdmaCm>(ctx: &mut V, ids: &[u32], timeout: Duration) {
    let mut left: Vec<u32> = ids.to_vec();
    for &id in ids {
        let _ = ctx.cm_disconnect(id);
    }
    let deadline = Instant::now() + timeout;
    while !left.is_empty() && Instant::now() < deadline {
        let slice = deadline.saturating_duration_since(Instant::now());
        match ctx.cm_wait_event(slice) {
            Ok(Some(CmEventData::Disconnected { id })) => left.retain(|&x| x != id),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
}

/// The UD path to a peer rdma_cm named (GRH to its GID, hop limit 64 as rdma_cm's AH).
pub fn ud_dest(local: &Local, peer: Gid, c: &Connected) -> UdDest {
    let mut av = AddressVector::new(peer, local.gid_index);
    av.hop_limit = 64;
    UdDest {
        ah: av,
        remote_qpn: c.peer_qpn,
        remote_qkey: Qkey(c.peer_qkey),
    }
}

/// The exchange's rdma_cm connection: an RC QP on a context of its own with one receive
/// posted at all times; each item is one SEND (perftest's `rdma_write_data`/`rdma_read_data`).
pub struct CmLink<V: Verbs + RdmaCm> {
    ctx: V,
    pd: PdId,
    scq: CqId,
    rcq: CqId,
    qp: Qpn,
    mr: Mr,
    buf: Buffer,
    conn: Option<u32>,
    /// A receive completion [`super::oob::Link::has_data`] took and `recv` has not.
    pending: Option<Completion>,
    /// The QP failed (the peer went away): every later item fails.
    broken: bool,
    /// Closed: the connection ended and the objects destroyed.
    closed: bool,
}

impl<V: Verbs + RdmaCm> Drop for CmLink<V> {
    /// A run that ends early still ends its connection (DREQ) rather than leave it to the
    /// peer's timeouts.
    fn drop(&mut self) {
        super::oob::Link::close(self);
    }
}

impl<V: Verbs + RdmaCm> CmLink<V> {
    fn create(mut ctx: V) -> Result<CmLink<V>, String> {
        let err = |what: &'static str| move |e| format!("-R exchange: {what}: {e}");
        let pd = ctx.alloc_pd().map_err(err("alloc PD"))?;
        let scq = ctx.create_cq(4).map_err(err("create CQ"))?;
        let rcq = ctx.create_cq(4).map_err(err("create CQ"))?;
        let buf = ctx.alloc_buffer(2 * SLOT).map_err(err("allocate buffer"))?;
        buf.fill(0);
        let mr = ctx
            .reg_mr(pd, &buf, 0, 2 * SLOT, Access::LOCAL_WRITE)
            .map_err(err("register MR"))?;
        let qp = ctx
            .create_qp(&QpInit {
                pd,
                qp_type: QpType::Rc,
                send_cq: scq,
                recv_cq: rcq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 2,
                    max_recv_wr: 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .map_err(err("create QP"))?;
        // INIT at once, as librdmacm's rdma_create_qp leaves it, so that the receive can be
        // posted before the connection exists (the bring-up then goes INIT -> INIT -> RTR).
        let init = roce::verbs::QpAttr {
            state: Some(roce::verbs::QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(Access::ALL),
            ..Default::default()
        };
        ctx.modify_qp(qp, &init).map_err(err("QP to INIT"))?;
        Ok(CmLink {
            ctx,
            pd,
            scq,
            rcq,
            qp,
            mr,
            buf,
            conn: None,
            pending: None,
            broken: false,
            closed: false,
        })
    }

    fn post_recv(&mut self) -> Result<(), String> {
        let sge = self.mr.sge(SLOT as u64, SLOT as u32);
        self.ctx
            .post_recv(
                self.qp,
                &RecvWr {
                    wr_id: 1,
                    sg_list: &[sge],
                },
            )
            .map_err(|e| format!("-R exchange: post receive: {e}"))
    }

    fn opts(mtu: Mtu) -> ConnOpts {
        // perftest's comm connection: SENDs only (no READ resources), 7 retries each.
        ConnOpts {
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            timeout: 14,
            mtu,
        }
    }

    /// The client's end: connects to `server`:`port` (port space TCP), trying again while
    /// the server is not listening, for up to `patience`.
    pub fn connect(
        ctx: V,
        server: Ipv4Addr,
        port: u16,
        patience: Duration,
    ) -> Result<CmLink<V>, String> {
        let mut l = Self::create(ctx)?;
        let local = Local::of(&mut l.ctx)?;
        let mtu = l.active_mtu()?;
        l.post_recv()?;
        let c = connect_rc(
            &mut l.ctx,
            &local,
            l.qp,
            server,
            port,
            &Self::opts(mtu),
            patience,
        )?;
        l.conn = Some(c.id);
        Ok(l)
    }

    /// The server's end: listens on `port` (port space TCP) for one connection, up to `wait`
    /// (None: until SIGINT/SIGTERM), then stops listening.
    pub fn accept(ctx: V, port: u16, wait: Option<Duration>) -> Result<CmLink<V>, String> {
        let mut l = Self::create(ctx)?;
        let local = Local::of(&mut l.ctx)?;
        let mtu = l.active_mtu()?;
        let sid = service_id(PS_TCP, port);
        l.post_recv()?;
        l.ctx
            .cm_listen(sid)
            .map_err(|e| format!("rdma_listen on port {port}: {e}"))?;
        let wait = wait.unwrap_or(Duration::from_secs(u32::MAX as u64));
        let r = accept_rc(&mut l.ctx, &local, l.qp, &Self::opts(mtu), wait);
        let _ = l.ctx.cm_unlisten(sid);
        l.conn = Some(r?.id);
        Ok(l)
    }

    fn active_mtu(&mut self) -> Result<Mtu, String> {
        Ok(self
            .ctx
            .query_port()
            .map_err(|e| format!("query port: {e}"))?
            .active_mtu)
    }

    /// One completion of `cq` within `timeout` (None: until SIGINT/SIGTERM), waiting in
    /// slices and looking between them for the peer's disconnection.
    fn wait(&mut self, cq: CqId, timeout: Option<Duration>) -> io::Result<Completion> {
        let started = Instant::now();
        let slice = Duration::from_millis(50);
        loop {
            let left = timeout.map(|t| t.saturating_sub(started.elapsed()));
            match poll_one(
                &mut self.ctx,
                cq,
                Some(left.map_or(slice, |l| l.min(slice))),
            ) {
                Ok(c) => return Ok(c),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    if left.is_some_and(|l| l <= slice) {
                        return Err(e);
                    }
                    // Once seen, the disconnection is remembered: later waits on this
                    // link end too instead of waiting for an event already taken.
                    if self.broken || self.peer_disconnected() {
                        self.broken = true;
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the peer closed the connection",
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the CM reported the exchange's connection ended: disconnected, or - for a
    /// server that accepted a client which went away before its RTU - rejected or timed out
    /// (rdma_cm's DISCONNECTED, REJECTED and CONNECT_ERROR events).
    fn peer_disconnected(&mut self) -> bool {
        while let Ok(Some(e)) = self.ctx.cm_get_event() {
            let ended = match e {
                CmEventData::Disconnected { id }
                | CmEventData::Rejected { id, .. }
                | CmEventData::TimedOut { id } => Some(id) == self.conn,
                _ => false,
            };
            if ended {
                self.conn = None;
                return true;
            }
        }
        false
    }

    fn gone(&mut self, c: &Completion) -> io::Error {
        self.broken = true;
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the peer closed the connection (the exchange QP completed with {:?})",
                c.status
            ),
        )
    }
}

impl<V: Verbs + RdmaCm> super::oob::Link for CmLink<V> {
    fn send(&mut self, item: &[u8]) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        if item.len() > SLOT {
            return Err(io::Error::other(format!(
                "an exchange item of {} bytes (at most {SLOT})",
                item.len()
            )));
        }
        self.buf.write(0, item);
        let sge = self.mr.sge(0, item.len() as u32);
        self.ctx
            .post_send(
                self.qp,
                &SendWr {
                    wr_id: 2,
                    op: WrOp::Send,
                    sg_list: &[sge],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            )
            .map_err(|e| io::Error::other(format!("post send: {e}")))?;
        // A SEND to a peer that stopped receiving retries for ever (RNR retries are
        // unlimited here): the wait watches for the peer's disconnection.
        let c = self.wait(self.scq, None)?;
        if c.status != WcStatus::Success || c.opcode != WcOpcode::Send {
            return Err(self.gone(&c));
        }
        Ok(())
    }

    fn recv(&mut self, n: usize, timeout: Option<Duration>) -> io::Result<Vec<u8>> {
        // A peer that went away without a word leaves a pending receive waiting for ever:
        // the wait watches for the peer's disconnection.
        let c = match self.pending.take() {
            Some(c) => c,
            None => self.wait(self.rcq, timeout)?,
        };
        if c.status != WcStatus::Success || c.opcode != WcOpcode::Recv {
            return Err(self.gone(&c));
        }
        if (c.byte_len as usize) < n {
            // The receive is consumed: post it again so the link stays usable.
            self.post_recv().map_err(io::Error::other)?;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer sent {} bytes where {n} were expected", c.byte_len),
            ));
        }
        let out = self.buf.to_vec(SLOT, n);
        self.post_recv().map_err(io::Error::other)?;
        Ok(out)
    }

    fn has_data(&mut self) -> bool {
        if self.pending.is_some() || self.broken {
            return true;
        }
        let mut wc = [Completion::default()];
        if let Ok(1) = self.ctx.poll_cq(self.rcq, &mut wc) {
            self.pending = Some(wc[0]);
            return true;
        }
        false
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        if let Some(id) = self.conn.take() {
            disconnect_all(&mut self.ctx, &[id], Duration::from_secs(2));
        }
        let _ = self.ctx.destroy_qp(self.qp);
        let _ = self.ctx.dereg_mr(&self.mr);
        let _ = self.ctx.destroy_cq(self.scq);
        let _ = self.ctx.destroy_cq(self.rcq);
        let _ = self.ctx.dealloc_pd(self.pd);
    }
}

/// The length of the receive that takes a client's QPN on a UD server: the GRH and 4
/// bytes (perftest's `UD_ADDITION + sizeof(uint32_t)`).
pub fn qpn_msg_len() -> u32 {
    super::res::GRH as u32 + 4
}

/// One completion of `cq`, waiting up to `timeout` (None: until SIGINT/SIGTERM), backing
/// off while idle.
pub fn poll_one<V: Verbs>(
    ctx: &mut V,
    cq: CqId,
    timeout: Option<Duration>,
) -> io::Result<Completion> {
    let started = Instant::now();
    let mut idle = 0u32;
    let mut wc = [Completion::default()];
    loop {
        let n = ctx
            .poll_cq(cq, &mut wc)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if n == 1 {
            return Ok(wc[0]);
        }
        if super::interrupted() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                super::INTERRUPTED,
            ));
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no completion in time",
            ));
        }
        super::bw::poll_backoff(idle);
        idle = idle.saturating_add(1);
    }
}

/// The `-R` exchange of a run on `ctx` (a context of its own on the test's RNIC): as client
/// of `server`, or as server waiting up to `accept_wait` for its client (None: until
/// SIGINT/SIGTERM), on rdma_cm port `port`. The connection is made when the run starts its
/// exchange.
pub fn comm<V: Verbs + RdmaCm + Send + 'static>(
    ctx: V,
    server: Option<Ipv4Addr>,
    port: u16,
    accept_wait: Option<Duration>,
) -> super::run::Endpoint {
    let make: super::run::CommCtx = Box::new(move || {
        let link = match server {
            Some(ip) => CmLink::connect(ctx, ip, port, super::run::CONNECT_PATIENCE)?,
            None => CmLink::accept(ctx, port, accept_wait)?,
        };
        Ok(Box::new(link) as Box<dyn super::oob::Link>)
    });
    super::run::Endpoint::Cm {
        server,
        port,
        comm: make,
    }
}
