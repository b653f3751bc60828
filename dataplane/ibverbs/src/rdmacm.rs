//! librdmacm's connection calls, for the `librdmacm.so.1` ferroce ships beside this library
//! (`rdmacm.c` forwards each `rdma_*` symbol to the `ferroce_rdma_*` function of the same
//! signature here): rdma_cm over ferroce's connection manager (IB CM on QP1, run by rnicd's
//! worker), so programs written for librdmacm (rping, ucmatose, udaddy) run unmodified.
//!
//! As librdmacm: an `rdma_cm_id` gets a device when its address is bound or resolved (the
//! device whose IPv4 address is the source, or for a destination the first device), the
//! events of every ID come through its event channel (an eventfd counts them, so the channel's
//! fd can be polled), `rdma_create_qp` creates the QP and moves it to INIT, and the library
//! moves it to RTR and RTS when the connection is made (active side: on the REP, then the RTU;
//! passive side: in `rdma_accept`), and to ERR in `rdma_disconnect`. Addresses are IPv4 (RoCEv2
//! GIDs ::ffff:a.b.c.d); the active side's REQ carries rdma_cm's addressing header, so a Linux
//! peer sees the request it expects.
//!
//! One background thread takes the connection events of every context an ID uses from rnicd
//! (a control call per context, every 1 ms while IDs exist), turns them into `rdma_cm_event`s
//! and queues each on its ID's channel.

use super::*;

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4};

use ferroce_host::abi::{CmEventData, Reach};
use ferroce_host::app::RdmaCm;
use roce::cm::{AcceptParams, ConnectParams, SidrParams, SIDR_REJECTED, SIDR_VALID};
use roce::wire::cm::{service_id, CmaHeader, PrivateData, CMA_HDR_LEN, RDMA_UDP_QKEY as UDP_QKEY};
/// READ/atomic depth this side offers when the application passes no connection parameters.
const DEFAULT_RD_ATOMIC: u8 = 16;
/// The device's limit of outstanding READ/ATOMIC per QP (rnicd's RNICs keep the engine's
/// default limits).
const MAX_RD_ATOMIC: u8 = roce::engine::MAX_QP_RD_ATOM;

/// An event channel: the application's `rdma_event_channel` (its fd, an eventfd counting the
/// queued events) first.
#[repr(C)]
struct Channel {
    ch: sys::rdma_event_channel,
    efd: OwnedFd,
    queue: Mutex<VecDeque<usize>>,
}

/// An event handed to the application, with room for its private data.
#[repr(C)]
struct Event {
    ev: sys::rdma_cm_event,
    private: [u8; 224],
}

/// What the library knows of an ID beyond the application's `rdma_cm_id`.
#[derive(Default)]
struct IdState {
    /// The connection's communication ID, once there is one.
    conn: Option<u32>,
    /// The service listened to.
    listening: Option<u64>,
    /// The contexts (devices) it listens on: every device for an ID bound to the wildcard
    /// address, as Linux listens on every device.
    listening_on: Vec<usize>,
    /// This side's and the peer's address.
    src: Option<SocketAddrV4>,
    dst: Option<SocketAddrV4>,
    /// The peer's QPN and where its requests start (from the REQ or the REP).
    peer_qpn: u32,
    peer_sq_psn: u32,
    /// Where this side's receive queue expects the peer's requests.
    my_rq_psn: u32,
    /// Path MTU (IBA encoding) and the transport retries agreed.
    path_mtu: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    /// READ/atomic depths: this side's responder resources and initiator depth.
    responder_resources: u8,
    initiator_depth: u8,
    /// The REP's private data, handed with ESTABLISHED on the active side.
    rep_private: Option<Vec<u8>>,
    disconnected: bool,
    /// Synchronous (`rdma_create_ep`): calls wait for their event on the ID's own channel,
    /// which goes with the ID.
    sync: bool,
    /// A synchronous listener's QP attributes (and PD) for the IDs `rdma_get_request` hands
    /// out.
    ep_qp: Option<(sys::ibv_qp_init_attr, usize)>,
    /// The CQs and completion channels the library made for the ID's QP (`rdma_create_qp`
    /// with none named, `rdma_create_ep`), send then receive, as (CQ, channel) addresses
    /// (0: the application's own): destroyed with the QP.
    made_cqs: [(usize, usize); 2],
    /// The application got CONNECT_RESPONSE (it had no QP) and finishes the handshake
    /// itself with rdma_establish: librdmacm then delivers no ESTABLISHED.
    self_established: bool,
}

/// An ID: the application's `rdma_cm_id` first.
#[repr(C)]
struct Id {
    id: sys::rdma_cm_id,
    st: Mutex<IdState>,
}

/// Every ID's connection and listen, by context, for the event thread.
#[derive(Default)]
struct Registry {
    conns: HashMap<(usize, u32), usize>,
    listeners: HashMap<(usize, u64), usize>,
    /// Contexts opened for IDs, by device name (kept open, as librdmacm keeps its devices).
    contexts: Vec<(String, usize)>,
    /// The devices and their IPv4 addresses, found once (rnicd's RNICs do not change while
    /// it runs): binding, resolving and listening then cost no round trip to rnicd.
    devices: Option<Vec<(usize, Ipv4Addr)>>,
    /// The IDs and event channels handed out and not yet destroyed. A pointer an application
    /// passes back is used only when it is one of these: a destroyed ID or channel used again
    /// (Debian's perftest 4.5-0.17 does so when it retries a rejected connection) is EINVAL,
    /// not a use after free.
    ids: HashSet<usize>,
    channels: HashSet<usize>,
    /// Destroyed IDs and channels, kept allocated a while (oldest freed first, `QUARANTINE`)
    /// so that their addresses are not handed out again at once: a stale pointer used right
    /// after its destroy finds no live entry rather than a new ID at the same address.
    dead_ids: VecDeque<usize>,
    dead_channels: VecDeque<usize>,
    thread: bool,
    /// Addresses being resolved (`rdma_resolve_addr`), asked of the RNIC by the event
    /// thread until its neighbour table answers or the caller's timeout passes.
    resolving: Vec<Resolving>,
}

/// An `rdma_resolve_addr` waiting for the RNIC to reach its destination.
struct Resolving {
    id: usize,
    ctx: usize,
    dgid: roce::types::Gid,
    deadline: std::time::Instant,
}

/// How many destroyed IDs, and channels, stay allocated (see `Registry::dead_ids`).
const QUARANTINE: usize = 64;

/// Retires a destroyed ID (`channel` false) or event channel (true), no longer in the live
/// sets: it is freed `QUARANTINE` destroys later.
///
/// # Safety
/// `ptr` is an `Id` or a `Channel` this library allocated, destroyed once.
unsafe fn bury(ptr: usize, channel: bool) {
    let old = {
        let mut r = reg();
        let dead = if channel {
            &mut r.dead_channels
        } else {
            &mut r.dead_ids
        };
        dead.push_back(ptr);
        if dead.len() > QUARANTINE {
            dead.pop_front()
        } else {
            None
        }
    };
    match old {
        Some(p) if channel => drop(Box::from_raw(p as *mut Channel)),
        Some(p) => drop(Box::from_raw(p as *mut Id)),
        None => {}
    }
}

static REG: OnceLock<Mutex<Registry>> = OnceLock::new();

/// Held while the event thread works on an ID and while an ID is destroyed, so an event
/// never reaches an ID being freed. Taken before a client's lock and the registry's.
static DISPATCH: Mutex<()> = Mutex::new(());

fn dispatching() -> std::sync::MutexGuard<'static, ()> {
    DISPATCH.lock().unwrap_or_else(|p| p.into_inner())
}

fn reg() -> std::sync::MutexGuard<'static, Registry> {
    REG.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn st(id: *mut sys::rdma_cm_id) -> std::sync::MutexGuard<'static, IdState> {
    // SAFETY: every rdma_cm_id this library hands out is the first field of an `Id`, live
    // until rdma_destroy_id.
    let id = unsafe { &*(id as *const Id) };
    id.st.lock().unwrap_or_else(|p| p.into_inner())
}

/// `guard` for a call on an ID: EINVAL unless `id` is a live ID of this library.
fn guard_id<T>(id: *mut sys::rdma_cm_id, err: T, f: impl FnOnce() -> T) -> T {
    if !reg().ids.contains(&(id as usize)) {
        return fail(libc::EINVAL, err);
    }
    guard(err, f)
}

/// Whether `ch` is a live event channel of this library.
fn live_channel(ch: *mut sys::rdma_event_channel) -> bool {
    reg().channels.contains(&(ch as usize))
}

fn fail<T>(e: c_int, v: T) -> T {
    set_errno(e);
    v
}

/// The errno a verbs error maps to, said under FERROCE_VERBOSE.
fn verr(e: &VerbsError) -> c_int {
    errno_of(e)
}

/// A context of every device with its IPv4 address (opened and looked up once, kept).
fn devices() -> Vec<(usize, Ipv4Addr)> {
    if let Some(d) = &reg().devices {
        return d.clone();
    }
    let mut out = Vec::new();
    for d in discover() {
        let existing = reg()
            .contexts
            .iter()
            .find(|(n, _)| *n == d.name)
            .map(|(_, c)| *c);
        let c = match existing {
            Some(c) => c,
            None => {
                // SAFETY: a device from the list, opened as an application would.
                let c = unsafe { ibv_open_device(&d.ibv as *const _ as *mut _) };
                if c.is_null() {
                    continue;
                }
                reg().contexts.push((d.name.clone(), c as usize));
                c as usize
            }
        };
        // SAFETY: the context just opened or kept.
        let Some(ctx) = (unsafe { ctx_of(c as *mut sys::ibv_context) }) else {
            continue;
        };
        // GID index 1 is the IPv4-mapped one (RoCEv2).
        if let Some(ip) = client(ctx).query_gid(1).ok().and_then(|g| g.to_ipv4()) {
            out.push((c, Ipv4Addr::from(ip)));
        }
    }
    if !out.is_empty() {
        reg().devices = Some(out.clone());
    }
    out
}

/// The device for a source address (unspecified: the first device).
fn device_for_src(ip: Ipv4Addr) -> Option<(usize, Ipv4Addr)> {
    let devs = devices();
    if ip.is_unspecified() {
        return devs.first().copied();
    }
    devs.into_iter().find(|(_, a)| *a == ip)
}

/// The device to reach `dst` from: another device on its /24 if there is one (the other end
/// of a link between two of ferroce's RNICs), else the device that is `dst` (internal
/// loopback), else the first.
fn device_for_dst(dst: Ipv4Addr) -> Option<(usize, Ipv4Addr)> {
    let devs = devices();
    let net = |a: Ipv4Addr| u32::from(a) >> 8;
    devs.iter()
        .find(|(_, a)| *a != dst && net(*a) == net(dst))
        .or_else(|| devs.iter().find(|(_, a)| *a == dst))
        .or(devs.first())
        .copied()
}

unsafe fn sockaddr_v4(a: *const sys::sockaddr) -> Option<SocketAddrV4> {
    if a.is_null() || (*a).sa_family as c_int != libc::AF_INET {
        return None;
    }
    let s = &*(a as *const sys::sockaddr_in);
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
        u16::from_be(s.sin_port),
    ))
}

fn to_sockaddr(a: SocketAddrV4) -> sys::sockaddr_in {
    sys::sockaddr_in {
        sin_family: libc::AF_INET as _,
        sin_port: a.port().to_be(),
        sin_addr: sys::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// A pseudo-random value (PSNs, ephemeral ports): time and a counter mixed.
fn random() -> u32 {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let x = (t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    (x >> 32) as u32 ^ x as u32
}

/// Sets the ID's addresses in the application's `rdma_cm_id` (route.addr).
unsafe fn show_addrs(id: *mut sys::rdma_cm_id, s: &IdState) {
    let a = &mut (*id).route.addr;
    if let Some(src) = s.src {
        a.__bindgen_anon_1.src_sin = to_sockaddr(src);
    }
    if let Some(dst) = s.dst {
        a.__bindgen_anon_2.dst_sin = to_sockaddr(dst);
    }
}

fn gid_of(ip: Ipv4Addr) -> Gid {
    Gid::from_ipv4(ip.octets())
}

/// Queues an event on the ID's channel and counts it on the channel's eventfd.
unsafe fn deliver(
    id: *mut sys::rdma_cm_id,
    listen: *mut sys::rdma_cm_id,
    kind: u32,
    status: c_int,
    conn: Option<(&[u8], &sys::rdma_conn_param)>,
) {
    deliver_on((*id).channel, id, listen, kind, status, conn)
}

/// [`deliver`] on channel `ch` (a synchronous listener's, for its requests).
unsafe fn deliver_on(
    ch: *mut sys::rdma_event_channel,
    id: *mut sys::rdma_cm_id,
    listen: *mut sys::rdma_cm_id,
    kind: u32,
    status: c_int,
    conn: Option<(&[u8], &sys::rdma_conn_param)>,
) {
    let mut e = new_event(id, listen, kind, status);
    if let Some((pd, p)) = conn {
        let n = e.keep_private(pd);
        e.ev.param.conn = *p;
        e.ev.param.conn.private_data_len = n as u8;
        e.ev.param.conn.private_data = e.private_ptr(n);
    }
    queue(ch, e);
}

fn new_event(
    id: *mut sys::rdma_cm_id,
    listen: *mut sys::rdma_cm_id,
    kind: u32,
    status: c_int,
) -> Box<Event> {
    Box::new(Event {
        ev: sys::rdma_cm_event {
            id,
            listen_id: listen,
            event: kind,
            status,
            ..Default::default()
        },
        private: [0; 224],
    })
}

impl Event {
    /// Copies the private data in (as much as fits); how much.
    fn keep_private(&mut self, pd: &[u8]) -> usize {
        let n = pd.len().min(self.private.len());
        self.private[..n].copy_from_slice(&pd[..n]);
        n
    }

    /// The application's pointer to `n` bytes of kept private data (NULL for none).
    fn private_ptr(&self, n: usize) -> *const c_void {
        if n == 0 {
            std::ptr::null()
        } else {
            self.private.as_ptr() as *const c_void
        }
    }
}

/// Queues a finished event on channel `ch` and counts it on the channel's eventfd.
unsafe fn queue(ch: *mut sys::rdma_event_channel, e: Box<Event>) {
    let ch = ch as *mut Channel;
    if ch.is_null() {
        return;
    }
    let ptr = Box::into_raw(e);
    (*ch)
        .queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(ptr as usize);
    count_up((*ch).efd.as_raw_fd());
}

/// Queues an event with UD parameters (rdma_cm over UDP: the peer's QP, Q_Key and path, and
/// private data) on channel `ch`.
unsafe fn deliver_ud(
    ch: *mut sys::rdma_event_channel,
    id: *mut sys::rdma_cm_id,
    listen: *mut sys::rdma_cm_id,
    kind: u32,
    pd: &[u8],
    ud: sys::rdma_ud_param,
) {
    let mut e = new_event(id, listen, kind, 0);
    let n = e.keep_private(pd);
    e.ev.param.ud = ud;
    e.ev.param.ud.private_data_len = n as u8;
    e.ev.param.ud.private_data = e.private_ptr(n);
    queue(ch, e);
}

/// The address of a UD peer at `gid`, as an application's `ibv_ah_attr` (RoCE: global, GID
/// index 1).
fn ud_ah(gid: Gid) -> sys::ibv_ah_attr {
    sys::ibv_ah_attr {
        grh: sys::ibv_global_route {
            dgid: sys::ibv_gid { raw: gid.0 },
            sgid_index: 1,
            hop_limit: 64,
            ..Default::default()
        },
        is_global: 1,
        port_num: 1,
        ..Default::default()
    }
}

/// A request (connect or SIDR) that came to a listener.
struct Request {
    /// The context (device) it came to.
    c: usize,
    listener: *mut sys::rdma_cm_id,
    qp_type: u32,
    /// The connection (or SIDR request) it opened.
    conn: u32,
    peer: Gid,
    local: Gid,
    service_id: u64,
}

/// A new ID for request `r`: on the listener's channel (a synchronous listener's requests get
/// their own channel, as synchronous IDs), on the device the request came to (a wildcard
/// listener listens on every one), with the addresses it names (this side: the address it
/// was sent to; the peer: rdma_cm's header, else its GID). Returns the ID, the header, and
/// the channel its request event goes to (rdma_get_request waits on a synchronous
/// listener's; the new ID's own channel takes the events after it).
unsafe fn request_id(
    r: &Request,
    private_data: &[u8],
) -> (
    *mut sys::rdma_cm_id,
    Option<CmaHeader>,
    *mut sys::rdma_event_channel,
) {
    let l = r.listener;
    let sync = st(l).sync;
    let ch = if sync {
        ferroce_rdma_create_event_channel()
    } else {
        (*l).channel
    };
    let child = new_id(ch, (*l).context, (*l).ps, r.qp_type);
    (*child).verbs = r.c as *mut sys::ibv_context;
    (*child).port_num = 1;
    let hdr = CmaHeader::parse(private_data);
    {
        let mut s = st(child);
        s.sync = sync;
        s.conn = Some(r.conn);
        s.src = r
            .local
            .to_ipv4()
            .map(|a| SocketAddrV4::new(a.into(), r.service_id as u16));
        s.dst = match hdr.map(|h| h.src) {
            Some(std::net::SocketAddr::V4(a)) => Some(a),
            _ => r.peer.to_ipv4().map(|a| SocketAddrV4::new(a.into(), 0)),
        };
        show_addrs(child, &s);
    }
    reg().conns.insert((r.c, r.conn), child as usize);
    (child, hdr, if sync { (*l).channel } else { ch })
}

/// Queues an event without connection parameters on the ID's channel.
unsafe fn notify(id: *mut sys::rdma_cm_id, kind: u32, status: c_int) {
    deliver(id, std::ptr::null_mut(), kind, status, None);
}

/// Starts the thread that takes connection events from rnicd (once).
fn ensure_thread() {
    let mut r = reg();
    if r.thread {
        return;
    }
    r.thread = true;
    drop(r);
    let _ = std::thread::Builder::new()
        .name("ferroce-rdmacm".into())
        .spawn(|| loop {
            let contexts: Vec<usize> = {
                let r = reg();
                if r.ids.is_empty() {
                    Vec::new()
                } else {
                    r.contexts.iter().map(|(_, c)| *c).collect()
                }
            };
            let mut got = false;
            for c in contexts {
                // SAFETY: contexts the registry keeps are never closed.
                let Some(ctx) = (unsafe { ctx_of(c as *mut sys::ibv_context) }) else {
                    continue;
                };
                let moving = moving_read();
                loop {
                    let e = client(ctx).cm_get_event();
                    match e {
                        Ok(Some(e)) => {
                            got = true;
                            // SAFETY: the IDs the registry names are live: destroy unlists
                            // them while holding DISPATCH, which this holds.
                            let _d = dispatching();
                            unsafe { dispatch(c, e) };
                        }
                        _ => break,
                    }
                }
                drop(moving);
            }
            got |= advance_resolutions();
            if !got {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
}

/// Moves the ID's QP to `state` with the attributes the connection agreed on.
unsafe fn move_qp(id: *mut sys::rdma_cm_id, state: u32) -> c_int {
    let qp = (*id).qp;
    if qp.is_null() {
        return 0;
    }
    let mut attr = sys::ibv_qp_attr::default();
    let mut mask = 0;
    let r = init_qp_attr(id, state, &mut attr, &mut mask);
    if r != 0 {
        return r;
    }
    ibv_modify_qp(qp, &mut attr, mask)
}

/// What `rdma_init_qp_attr` answers: the attributes of the QP's move to `state`.
unsafe fn init_qp_attr(
    id: *mut sys::rdma_cm_id,
    state: u32,
    a: &mut sys::ibv_qp_attr,
    mask: &mut c_int,
) -> c_int {
    use roce::verbs::ibv::qp_attr_mask as m;
    let s = st(id);
    a.qp_state = state;
    let ud = (*id).qp_type == sys::IBV_QPT_UD;
    let bits = match state {
        sys::IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = UDP_QKEY;
                m::STATE | m::PKEY_INDEX | m::PORT | m::QKEY
            } else {
                a.qp_access_flags = sys::IBV_ACCESS_REMOTE_READ
                    | sys::IBV_ACCESS_REMOTE_WRITE
                    | sys::IBV_ACCESS_REMOTE_ATOMIC
                    | sys::IBV_ACCESS_LOCAL_WRITE;
                m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS
            }
        }
        sys::IBV_QPS_RTR if ud => m::STATE,
        sys::IBV_QPS_RTR => {
            let (Some(dst), Some(_)) = (s.dst, s.conn) else {
                return fail(libc::EINVAL, -1);
            };
            a.path_mtu = s.path_mtu.clamp(1, 5) as u32;
            a.dest_qp_num = s.peer_qpn;
            a.rq_psn = s.my_rq_psn;
            a.max_dest_rd_atomic = s.responder_resources;
            a.min_rnr_timer = 12;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid.raw = gid_of(*dst.ip()).0;
            a.ah_attr.grh.sgid_index = 1;
            a.ah_attr.grh.hop_limit = 64;
            m::STATE
                | m::AV
                | m::PATH_MTU
                | m::DEST_QPN
                | m::RQ_PSN
                | m::MAX_DEST_RD_ATOMIC
                | m::MIN_RNR_TIMER
        }
        sys::IBV_QPS_RTS if ud => {
            a.sq_psn = s.my_rq_psn;
            m::STATE | m::SQ_PSN
        }
        sys::IBV_QPS_RTS => {
            a.sq_psn = s.peer_sq_psn;
            a.timeout = 14;
            a.retry_cnt = s.retry_count.min(7);
            a.rnr_retry = s.rnr_retry_count.min(7);
            a.max_rd_atomic = s.initiator_depth;
            m::STATE | m::SQ_PSN | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC
        }
        sys::IBV_QPS_ERR | sys::IBV_QPS_RESET => m::STATE,
        _ => return fail(libc::EINVAL, -1),
    };
    *mask = bits as c_int;
    0
}

/// One connection event from rnicd for context `c`, made an `rdma_cm_event` of its ID.
unsafe fn dispatch(c: usize, e: CmEventData) {
    let conn_id = e.id();
    let id = {
        let r = reg();
        match &e {
            CmEventData::ConnectRequest { service_id, .. }
            | CmEventData::SidrRequest { service_id, .. } => {
                r.listeners.get(&(c, *service_id)).copied()
            }
            _ => r.conns.get(&(c, conn_id)).copied(),
        }
    };
    let Some(id) = id.map(|p| p as *mut sys::rdma_cm_id) else {
        // A request for a listener that is gone (destroyed, or a listen on several devices
        // that failed on a later one): refused, so that nothing waits for an answer.
        if let Some(ctx) = ctx_of(c as *mut sys::ibv_context) {
            match e {
                CmEventData::ConnectRequest { .. } => {
                    let _ = client(ctx).cm_reject(conn_id, &[]);
                }
                CmEventData::SidrRequest { .. } => {
                    let _ = client(ctx).cm_sidr_reply(conn_id, SIDR_REJECTED, 0, 0, &[]);
                }
                _ => {}
            }
        }
        return;
    };
    let mut p = sys::rdma_conn_param::default();
    match e {
        CmEventData::ConnectRequest {
            id: cid,
            peer,
            local,
            qpn,
            starting_psn,
            responder_resources,
            initiator_depth,
            path_mtu,
            retry_count,
            rnr_retry_count,
            private_data,
            service_id,
        } => {
            let req = Request {
                c,
                listener: id,
                qp_type: (*id).qp_type,
                conn: cid,
                peer,
                local,
                service_id,
            };
            let (child, hdr, ch) = request_id(&req, &private_data);
            {
                let mut s = st(child);
                s.peer_qpn = qpn.value();
                s.peer_sq_psn = starting_psn;
                s.path_mtu = path_mtu;
                s.retry_count = retry_count;
                s.rnr_retry_count = rnr_retry_count;
                // What rdma_accept agrees to unless told otherwise (librdmacm's
                // ucma_process_conn_req): the request's depths from this side, within the
                // device's limit.
                s.responder_resources = initiator_depth.min(MAX_RD_ATOMIC);
                s.initiator_depth = responder_resources.min(MAX_RD_ATOMIC);
            }
            // From the receiver's side: the requester's depth is what it may be asked to
            // answer, and the other way round.
            p.responder_resources = initiator_depth;
            p.initiator_depth = responder_resources;
            p.retry_count = retry_count;
            p.rnr_retry_count = rnr_retry_count;
            p.qp_num = qpn.value();
            let user = if hdr.is_some() {
                &private_data[CMA_HDR_LEN..]
            } else {
                &private_data[..]
            };
            deliver_on(
                ch,
                child,
                id,
                sys::RDMA_CM_EVENT_CONNECT_REQUEST,
                0,
                Some((user, &p)),
            );
        }
        CmEventData::RepReceived {
            qpn,
            starting_psn,
            responder_resources,
            rnr_retry_count,
            private_data,
            ..
        } => {
            {
                let mut s = st(id);
                s.peer_qpn = qpn.value();
                s.peer_sq_psn = starting_psn;
                s.initiator_depth = s.initiator_depth.min(responder_resources);
                s.rnr_retry_count = rnr_retry_count;
                s.rep_private = Some(private_data.clone());
            }
            if (*id).qp.is_null() {
                // The application moves its own QP, then calls rdma_establish.
                st(id).self_established = true;
                p.qp_num = qpn.value();
                p.responder_resources = responder_resources;
                deliver(
                    id,
                    std::ptr::null_mut(),
                    sys::RDMA_CM_EVENT_CONNECT_RESPONSE,
                    0,
                    Some((&private_data, &p)),
                );
                return;
            }
            let ok = move_qp(id, sys::IBV_QPS_RTR) == 0 && move_qp(id, sys::IBV_QPS_RTS) == 0;
            let ctx = ctx_of((*id).verbs);
            if !ok || ctx.is_none_or(|ctx| client(ctx).cm_rtu(conn_id).is_err()) {
                notify(id, sys::RDMA_CM_EVENT_CONNECT_ERROR, -libc::EINVAL);
            }
        }
        CmEventData::Established { .. } => {
            // After CONNECT_RESPONSE and rdma_establish the connection is up without an
            // event (librdmacm's rdma_establish only sends the RTU).
            if std::mem::take(&mut st(id).self_established) {
                return;
            }
            let rep = st(id).rep_private.take();
            let pd = rep.unwrap_or_default();
            deliver(
                id,
                std::ptr::null_mut(),
                sys::RDMA_CM_EVENT_ESTABLISHED,
                0,
                Some((&pd, &p)),
            );
        }
        CmEventData::Rejected {
            reason,
            private_data,
            ..
        } => {
            reg().conns.remove(&(c, conn_id));
            st(id).conn = None;
            deliver(
                id,
                std::ptr::null_mut(),
                sys::RDMA_CM_EVENT_REJECTED,
                reason as c_int,
                Some((&private_data, &p)),
            );
        }
        CmEventData::TimedOut { .. } => {
            reg().conns.remove(&(c, conn_id));
            st(id).conn = None;
            notify(id, sys::RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT);
        }
        CmEventData::Disconnected { .. } => {
            // The QP is left alone, as librdmacm leaves it: the application may already have
            // destroyed it (rping calls ibv_destroy_qp itself), so `id->qp` can dangle.
            st(id).disconnected = true;
            notify(id, sys::RDMA_CM_EVENT_DISCONNECTED, 0);
        }
        CmEventData::Released { .. } => {
            reg().conns.remove(&(c, conn_id));
        }
        CmEventData::SidrReply {
            status,
            qpn,
            qkey,
            private_data,
            ..
        } => {
            reg().conns.remove(&(c, conn_id));
            st(id).conn = None;
            if status != SIDR_VALID {
                notify(id, sys::RDMA_CM_EVENT_UNREACHABLE, status as c_int);
                return;
            }
            let Some(dst) = st(id).dst else { return };
            let ud = sys::rdma_ud_param {
                ah_attr: ud_ah(gid_of(*dst.ip())),
                qp_num: qpn.value(),
                qkey,
                ..Default::default()
            };
            deliver_ud(
                (*id).channel,
                id,
                std::ptr::null_mut(),
                sys::RDMA_CM_EVENT_ESTABLISHED,
                &private_data,
                ud,
            );
        }
        CmEventData::SidrRequest {
            id: rid,
            service_id,
            peer,
            local,
            private_data,
        } => {
            // As a connect request: a new ID on the listener's device, answered with
            // rdma_accept (the SIDR_REP naming its QP) or rdma_reject.
            let req = Request {
                c,
                listener: id,
                qp_type: sys::IBV_QPT_UD,
                conn: rid,
                peer,
                local,
                service_id,
            };
            let (child, hdr, ch) = request_id(&req, &private_data);
            let user = if hdr.is_some() {
                &private_data[CMA_HDR_LEN..]
            } else {
                &private_data[..]
            };
            let ud = sys::rdma_ud_param {
                ah_attr: ud_ah(peer),
                ..Default::default()
            };
            deliver_ud(ch, child, id, sys::RDMA_CM_EVENT_CONNECT_REQUEST, user, ud);
        }
    }
}

unsafe fn new_id(
    ch: *mut sys::rdma_event_channel,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> *mut sys::rdma_cm_id {
    let b = Box::new(Id {
        id: sys::rdma_cm_id {
            channel: ch,
            context,
            ps,
            qp_type,
            ..Default::default()
        },
        st: Mutex::new(IdState::default()),
    });
    let id = Box::into_raw(b) as *mut sys::rdma_cm_id;
    reg().ids.insert(id as usize);
    id
}

/// Runs `f` with the ID's context (the device it was bound or resolved to); EINVAL without
/// one. Panics become EFAULT, as for every call of this library.
fn on_ctx(id: *mut sys::rdma_cm_id, f: impl FnOnce(&'static Ctx) -> c_int) -> c_int {
    guard_id(id, -1, || match context(id) {
        Some(ctx) => f(ctx),
        None => fail(libc::EINVAL, -1),
    })
}

fn context(id: *mut sys::rdma_cm_id) -> Option<&'static Ctx> {
    // SAFETY: a live ID; its verbs is a context of this library or NULL.
    unsafe { ctx_of((*id).verbs) }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_event_channel() -> *mut sys::rdma_event_channel {
    guard(std::ptr::null_mut(), || {
        let Some(efd) = eventfd(libc::EFD_SEMAPHORE) else {
            return fail(libc::EMFILE, std::ptr::null_mut());
        };
        ensure_thread();
        let ch = Box::new(Channel {
            ch: sys::rdma_event_channel {
                fd: efd.as_raw_fd(),
            },
            efd,
            queue: Mutex::new(VecDeque::new()),
        });
        let ch = Box::into_raw(ch) as *mut sys::rdma_event_channel;
        reg().channels.insert(ch as usize);
        ch
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_event_channel(ch: *mut sys::rdma_event_channel) {
    guard((), || {
        if !reg().channels.remove(&(ch as usize)) {
            set_errno(libc::EINVAL);
            return;
        }
        let c = ch as *mut Channel;
        for e in (*c)
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            drop(Box::from_raw(e as *mut Event));
        }
        bury(ch as usize, true);
    })
}

/// The channel an ID is to use: `ch` if it is live; for none, a new one of its own (then
/// synchronous, the flag); `None` for a channel that is not live (or none to be made).
unsafe fn channel_or_own(
    ch: *mut sys::rdma_event_channel,
) -> Option<(*mut sys::rdma_event_channel, bool)> {
    if !ch.is_null() {
        return live_channel(ch).then_some((ch, false));
    }
    let own = ferroce_rdma_create_event_channel();
    (!own.is_null()).then_some((own, true))
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_id(
    ch: *mut sys::rdma_event_channel,
    id: *mut *mut sys::rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard(-1, || {
        // No channel: a synchronous ID (librdmacm's rdma_create_id2), with a channel of its
        // own that its calls wait on (resolve, connect, accept) and that goes with it.
        if id.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let Some((ch, sync)) = channel_or_own(ch) else {
            return fail(libc::EINVAL, -1);
        };
        let qp_type = if ps == sys::RDMA_PS_UDP || ps == sys::RDMA_PS_IPOIB {
            sys::IBV_QPT_UD
        } else {
            sys::IBV_QPT_RC
        };
        *id = new_id(ch, context, ps, qp_type);
        st(*id).sync = sync;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_id(id: *mut sys::rdma_cm_id) -> c_int {
    guard(-1, || {
        // Claimed first: a second destroy of the same ID (another thread's, or a stale
        // pointer's) finds it gone.
        if !reg().ids.remove(&(id as usize)) {
            return fail(libc::EINVAL, -1);
        }
        // No event is being handed to it meanwhile.
        let _d = dispatching();
        // An address it was resolving is no longer asked for.
        reg().resolving.retain(|p| p.id != id as usize);
        let (conn, listening, on) = {
            let mut s = st(id);
            (s.conn, s.listening, std::mem::take(&mut s.listening_on))
        };
        if let Some(sid) = listening {
            for c in on {
                // SAFETY: contexts the registry keeps are never closed.
                if let Some(ctx) = ctx_of(c as *mut sys::ibv_context) {
                    let _ = client(ctx).cm_unlisten(sid);
                }
                reg().listeners.remove(&(c, sid));
            }
        }
        if let Some(ctx) = context(id) {
            let c = (*id).verbs as usize;
            let mut cl = client(ctx);
            if let Some(cid) = conn {
                // The worker ends the connection as the kernel's cm_destroy_id does: an
                // established one is disconnected (DREQ), one still in its handshake (a
                // connect request never answered, a REP not yet confirmed) is refused, a
                // REQ of ours not yet answered is withdrawn (REJ): the peer hears at once
                // instead of retrying for a minute, and the worker lets the connection go.
                let _ = cl.cm_destroy(cid);
                reg().conns.remove(&(c, cid));
            }
        }
        // Events still queued for it go with it (on a channel still live: an application
        // may have destroyed the channel first), and so do the connect requests that came
        // to it as a listener and were not taken: their IDs, never handed out, are
        // destroyed and the requests refused, as the kernel's ucma destroys a listener's
        // pending children (each sends a REJ).
        let ch = (*id).channel as *mut Channel;
        let mut orphans = Vec::new();
        if live_channel(ch as *mut sys::rdma_event_channel) {
            (*ch)
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|e| {
                    let ev = *e as *mut Event;
                    let request = (*ev).ev.event == sys::RDMA_CM_EVENT_CONNECT_REQUEST
                        && (*ev).ev.listen_id == id;
                    let mine = (*ev).ev.id == id || request;
                    if request {
                        orphans.push((*ev).ev.id);
                    }
                    if mine {
                        drop(Box::from_raw(ev));
                        count_down((*ch).efd.as_raw_fd());
                    }
                    !mine
                });
        }
        for child in orphans {
            if !reg().ids.remove(&(child as usize)) {
                continue;
            }
            let conn = st(child).conn.take();
            if let (Some(ctx), Some(cid)) = (context(child), conn) {
                let _ = client(ctx).cm_reject(cid, &[]);
                reg().conns.remove(&((*child).verbs as usize, cid));
            }
            bury(child as usize, false);
        }
        // A synchronous ID's channel is its own (rdma_create_ep, rdma_get_request): it goes
        // with the ID, as in rdma-core's rdma_destroy_id.
        let sync = st(id).sync;
        bury(id as usize, false);
        if sync {
            ferroce_rdma_destroy_event_channel(ch as *mut sys::rdma_event_channel);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_bind_addr(
    id: *mut sys::rdma_cm_id,
    addr: *mut sys::sockaddr,
) -> c_int {
    guard_id(id, -1, || {
        let Some(a) = sockaddr_v4(addr) else {
            return fail(libc::EAFNOSUPPORT, -1);
        };
        let Some((c, ip)) = device_for_src(*a.ip()) else {
            return fail(libc::EADDRNOTAVAIL, -1);
        };
        (*id).verbs = c as *mut sys::ibv_context;
        (*id).port_num = 1;
        let port = if a.port() == 0 {
            32768 + (random() % 28000) as u16
        } else {
            a.port()
        };
        let mut s = st(id);
        s.src = Some(SocketAddrV4::new(
            if a.ip().is_unspecified() { *a.ip() } else { ip },
            port,
        ));
        show_addrs(id, &s);
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_listen(id: *mut sys::rdma_cm_id, _backlog: c_int) -> c_int {
    on_ctx(id, |_| {
        let Some(src) = st(id).src else {
            return fail(libc::EINVAL, -1);
        };
        let sid = service_id((*id).ps as u16, src.port());
        // The wildcard address listens on every device (requests come to the one they were
        // sent to); a specific one on its own device.
        let on: Vec<usize> = if src.ip().is_unspecified() {
            devices().into_iter().map(|(c, _)| c).collect()
        } else {
            vec![(*id).verbs as usize]
        };
        // The CM hands over a request it held for this service (one that came before the
        // listen, CmConfig::unclaimed_hold_ms) as soon as the listen is made: the event
        // thread must not dispatch it before the registry names this ID as the listener.
        let _d = dispatching();
        let mut done = Vec::new();
        for &c in &on {
            let Some(ctx) = ctx_of(c as *mut sys::ibv_context) else {
                continue;
            };
            let r = client(ctx).cm_listen(sid);
            if let Err(e) = r {
                for &d in &done {
                    if let Some(ctx) = ctx_of(d as *mut sys::ibv_context) {
                        let _ = client(ctx).cm_unlisten(sid);
                    }
                }
                let errno = if matches!(e, VerbsError::Busy(_)) {
                    libc::EADDRINUSE
                } else {
                    verr(&e)
                };
                return fail(errno, -1);
            }
            done.push(c);
        }
        let mut r = reg();
        for &c in &done {
            r.listeners.insert((c, sid), id as usize);
        }
        drop(r);
        let mut s = st(id);
        s.listening = Some(sid);
        s.listening_on = done;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_resolve_addr(
    id: *mut sys::rdma_cm_id,
    src: *mut sys::sockaddr,
    dst: *mut sys::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard_id(id, -1, || {
        let Some(d) = sockaddr_v4(dst) else {
            return fail(libc::EAFNOSUPPORT, -1);
        };
        if !src.is_null() && ferroce_rdma_bind_addr(id, src) != 0 {
            return -1;
        }
        if (*id).verbs.is_null() || st(id).src.is_none_or(|s| s.ip().is_unspecified()) {
            let Some((c, ip)) = device_for_dst(*d.ip()) else {
                return fail(libc::EADDRNOTAVAIL, -1);
            };
            (*id).verbs = c as *mut sys::ibv_context;
            (*id).port_num = 1;
            let port = st(id).src.map_or(0, |s| s.port());
            let port = if port == 0 {
                32768 + (random() % 28000) as u16
            } else {
                port
            };
            st(id).src = Some(SocketAddrV4::new(ip, port));
        }
        let mut s = st(id);
        s.dst = Some(d);
        show_addrs(id, &s);
        drop(s);
        // ADDR_RESOLVED once the RNIC knows the next hop's MAC (ARP / neighbour discovery
        // started now), ADDR_ERROR if it has no route, its neighbour does not answer or
        // `timeout_ms` passes, as the kernel's rdma_resolve_ip: a wrong address fails in
        // seconds instead of a connect that retries its REQ for a minute and a half.
        let wait = Duration::from_millis(if timeout_ms > 0 {
            timeout_ms as u64
        } else {
            2000
        });
        let mut r = reg();
        r.resolving.retain(|p| p.id != id as usize);
        r.resolving.push(Resolving {
            id: id as usize,
            ctx: (*id).verbs as usize,
            dgid: roce::types::Gid::from_ipv4(d.ip().octets()),
            deadline: std::time::Instant::now() + wait,
        });
        drop(r);
        ensure_thread();
        if is_sync(id) {
            return wait_for(id, sys::RDMA_CM_EVENT_ADDR_RESOLVED);
        }
        0
    })
}

/// Asks the RNIC how each address being resolved stands and delivers ADDR_RESOLVED or
/// ADDR_ERROR for those it has an answer for (or whose time is up); returns whether any
/// was answered.
fn advance_resolutions() -> bool {
    let pending = std::mem::take(&mut reg().resolving);
    if pending.is_empty() {
        return false;
    }
    let mut keep = Vec::new();
    let mut answered = false;
    for p in pending {
        // SAFETY: contexts the registry keeps are never closed.
        let reach = match unsafe { ctx_of(p.ctx as *mut sys::ibv_context) } {
            Some(ctx) => client(ctx).resolve_neighbor(p.dgid),
            None => Err(VerbsError::DeviceFatal),
        };
        let outcome = match reach {
            Ok(Reach::Resolved) => (sys::RDMA_CM_EVENT_ADDR_RESOLVED, 0),
            Ok(Reach::Pending) if std::time::Instant::now() < p.deadline => {
                keep.push(p);
                continue;
            }
            Ok(Reach::Pending) => (sys::RDMA_CM_EVENT_ADDR_ERROR, -libc::ETIMEDOUT),
            Ok(Reach::Unreachable) | Err(_) => (sys::RDMA_CM_EVENT_ADDR_ERROR, -libc::EHOSTUNREACH),
        };
        answered = true;
        // SAFETY: an ID still listed is live: destroy unlists it before it takes DISPATCH,
        // which this holds while delivering. A newer rdma_resolve_addr of the same ID
        // (listed meanwhile) gets the answer instead of this one. Heap writes follow: not
        // while registration moves pages.
        let _moving = moving_read();
        let _d = dispatching();
        let r = reg();
        let current = r.ids.contains(&p.id) && !r.resolving.iter().any(|n| n.id == p.id);
        drop(r);
        if current {
            unsafe { notify(p.id as *mut sys::rdma_cm_id, outcome.0, outcome.1) };
        }
    }
    let mut r = reg();
    // An ID asked again meanwhile (or destroyed) is not asked on its old entry.
    keep.retain(|p| r.ids.contains(&p.id) && !r.resolving.iter().any(|n| n.id == p.id));
    r.resolving.extend(keep);
    answered
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_resolve_route(
    id: *mut sys::rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    guard_id(id, -1, || {
        if st(id).dst.is_none() {
            return fail(libc::EINVAL, -1);
        }
        // Resolved at once (the address's next hop is known): a synchronous ID has its
        // answer now, an asynchronous one gets the event.
        if !is_sync(id) {
            notify(id, sys::RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
        }
        0
    })
}

/// The PD a QP of the ID goes on: the one given, else the ID's, else a new one on its device.
unsafe fn qp_pd(id: *mut sys::rdma_cm_id, pd: *mut sys::ibv_pd) -> Option<*mut sys::ibv_pd> {
    let pd = if pd.is_null() { (*id).pd } else { pd };
    let pd = if pd.is_null() {
        let p = ibv_alloc_pd((*id).verbs);
        if p.is_null() {
            return None;
        }
        p
    } else {
        pd
    };
    ((*pd).context == (*id).verbs)
        .then_some(pd)
        .or_else(|| fail(libc::EINVAL, None))
}

/// Makes `qp` the ID's and moves it to INIT (UD: on to RTS, ready at once, as rdma_cm does).
unsafe fn adopt_qp(id: *mut sys::rdma_cm_id, qp: *mut sys::ibv_qp, pd: *mut sys::ibv_pd) -> c_int {
    (*id).qp = qp;
    (*id).pd = pd;
    (*id).qp_type = (*qp).qp_type;
    (*id).send_cq = (*qp).send_cq;
    (*id).recv_cq = (*qp).recv_cq;
    let r = move_qp(id, sys::IBV_QPS_INIT);
    if r != 0 {
        ibv_destroy_qp(qp);
        (*id).qp = std::ptr::null_mut();
        return fail(r, -1);
    }
    if (*id).qp_type == sys::IBV_QPT_UD {
        let _ = move_qp(id, sys::IBV_QPS_RTR);
        let _ = move_qp(id, sys::IBV_QPS_RTS);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_qp(
    id: *mut sys::rdma_cm_id,
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    guard_id(id, -1, || {
        if attr.is_null() || (*id).verbs.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let Some(pd) = qp_pd(id, pd) else {
            return -1;
        };
        // No CQ named: the library makes them, as librdmacm's rdma_create_qp does, and says
        // so in the caller's attributes.
        if ((*attr).send_cq.is_null() || (*attr).recv_cq.is_null()) && make_cqs(id, &mut *attr) != 0
        {
            return -1;
        }
        let qp = ibv_create_qp(pd, attr);
        let r = if qp.is_null() {
            -1
        } else {
            adopt_qp(id, qp, pd)
        };
        if r != 0 {
            let e = *libc::__errno_location();
            forget_made_cqs(id, &mut *attr);
            return fail(e, -1);
        }
        0
    })
}

/// Makes the CQs `a` does not name (librdmacm's ucma_create_cqs): each with its own
/// completion channel and the ID as its context, as rdma_get_send_comp and
/// rdma_get_recv_comp expect, sized by the QP's send and receive depths; kept in the ID
/// and destroyed with its QP.
unsafe fn make_cqs(id: *mut sys::rdma_cm_id, a: &mut sys::ibv_qp_init_attr) -> c_int {
    let v = (*id).verbs;
    for i in 0..2 {
        let (named, wr) = if i == 0 {
            (&mut a.send_cq, a.cap.max_send_wr)
        } else {
            (&mut a.recv_cq, a.cap.max_recv_wr)
        };
        if !named.is_null() {
            continue;
        }
        let ch = ibv_create_comp_channel(v);
        let made = if ch.is_null() {
            std::ptr::null_mut()
        } else {
            ibv_create_cq(v, wr.max(1) as c_int, id as *mut c_void, ch, 0)
        };
        st(id).made_cqs[i] = (made as usize, ch as usize);
        if made.is_null() {
            forget_made_cqs(id, a);
            return fail(libc::ENOMEM, -1);
        }
        *named = made;
        *id_cq(id, i).1 = ch;
    }
    0
}

/// The ID's send (`i` 0) or receive (1) CQ and its completion channel.
unsafe fn id_cq<'a>(
    id: *mut sys::rdma_cm_id,
    i: usize,
) -> (&'a mut *mut sys::ibv_cq, &'a mut *mut sys::ibv_comp_channel) {
    if i == 0 {
        (&mut (*id).send_cq, &mut (*id).send_cq_channel)
    } else {
        (&mut (*id).recv_cq, &mut (*id).recv_cq_channel)
    }
}

/// Undoes [`make_cqs`] after a failure: the CQs it made are destroyed and no longer named
/// by the caller's attributes (a retry with them makes new ones).
unsafe fn forget_made_cqs(id: *mut sys::rdma_cm_id, a: &mut sys::ibv_qp_init_attr) {
    let made = st(id).made_cqs;
    for (i, cq) in [&mut a.send_cq, &mut a.recv_cq].into_iter().enumerate() {
        if made[i].0 != 0 && *cq as usize == made[i].0 {
            *cq = std::ptr::null_mut();
        }
    }
    destroy_made_cqs(id);
}

/// Destroys the CQs and channels [`make_cqs`] made for the ID, if any.
unsafe fn destroy_made_cqs(id: *mut sys::rdma_cm_id) {
    let made = std::mem::take(&mut st(id).made_cqs);
    for (i, (cq, ch)) in made.into_iter().enumerate() {
        let (id_cq, id_ch) = id_cq(id, i);
        if cq != 0 {
            ibv_destroy_cq(cq as *mut sys::ibv_cq);
            *id_cq = std::ptr::null_mut();
        }
        if ch != 0 {
            ibv_destroy_comp_channel(ch as *mut sys::ibv_comp_channel);
            *id_ch = std::ptr::null_mut();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_qp_ex(
    id: *mut sys::rdma_cm_id,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> c_int {
    guard_id(id, -1, || {
        if attr.is_null() || (*id).verbs.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let given = if (*attr).comp_mask & sys::IBV_QP_INIT_ATTR_PD != 0 {
            (*attr).pd
        } else {
            std::ptr::null_mut()
        };
        let Some(pd) = qp_pd(id, given) else {
            return -1;
        };
        (*attr).pd = pd;
        (*attr).comp_mask |= sys::IBV_QP_INIT_ATTR_PD;
        let qp = create_qp_ex((*id).verbs, attr);
        if qp.is_null() {
            return -1;
        }
        adopt_qp(id, qp, pd)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_qp(id: *mut sys::rdma_cm_id) {
    guard_id(id, (), || {
        if !(*id).qp.is_null() {
            ibv_destroy_qp((*id).qp);
            (*id).qp = std::ptr::null_mut();
        }
        // The CQs the library made for it go with it (librdmacm's ucma_destroy_cqs).
        destroy_made_cqs(id);
    })
}

/// The application's connection parameters, or librdmacm's defaults; RDMA_MAX_RESP_RES and
/// RDMA_MAX_INIT_DEPTH (0xFF) ask for the device's limit.
unsafe fn conn_param(p: *const sys::rdma_conn_param) -> sys::rdma_conn_param {
    let mut p = if p.is_null() {
        sys::rdma_conn_param {
            responder_resources: DEFAULT_RD_ATOMIC,
            initiator_depth: DEFAULT_RD_ATOMIC,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        }
    } else {
        *p
    };
    p.responder_resources = p.responder_resources.min(MAX_RD_ATOMIC);
    p.initiator_depth = p.initiator_depth.min(MAX_RD_ATOMIC);
    p
}

/// rdma_accept's parameters: with none (NULL), or with RDMA_MAX_RESP_RES /
/// RDMA_MAX_INIT_DEPTH, the depths the connect request asked for within the device's limit
/// (librdmacm's rdma_accept), never more than the requester can use.
unsafe fn accept_param(
    id: *mut sys::rdma_cm_id,
    raw: *const sys::rdma_conn_param,
) -> sys::rdma_conn_param {
    let (resp, init) = {
        let s = st(id);
        (s.responder_resources, s.initiator_depth)
    };
    let mut p = conn_param(raw);
    if raw.is_null() || (*raw).responder_resources == u8::MAX {
        p.responder_resources = resp;
    }
    if raw.is_null() || (*raw).initiator_depth == u8::MAX {
        p.initiator_depth = init;
    }
    p
}

unsafe fn private(p: &sys::rdma_conn_param) -> &[u8] {
    if p.private_data.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
    }
}

/// The QP a connection names: the ID's own, else the one the application gives in `p`.
unsafe fn qp_num(id: *mut sys::rdma_cm_id, p: &sys::rdma_conn_param) -> u32 {
    if (*id).qp.is_null() {
        p.qp_num
    } else {
        (*(*id).qp).qp_num
    }
}

/// Draws our receive PSN for a connection of the ID and records it with `p`'s RDMA read
/// resources (the ID's QP is moved with them); the PSN.
unsafe fn start_conn(id: *mut sys::rdma_cm_id, p: &sys::rdma_conn_param) -> u32 {
    let my_rq_psn = random() & 0xff_ffff;
    let mut s = st(id);
    s.my_rq_psn = my_rq_psn;
    s.responder_resources = p.responder_resources;
    s.initiator_depth = p.initiator_depth;
    my_rq_psn
}

/// The port's active MTU in IBA's encoding.
unsafe fn active_mtu(c: *mut sys::ibv_context) -> u8 {
    let mut pa = std::mem::zeroed::<sys::ibv_port_attr>();
    if ibv_query_port(c, 1, &mut pa as *mut _ as *mut _) == 0 {
        pa.active_mtu as u8
    } else {
        3
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_connect(
    id: *mut sys::rdma_cm_id,
    p: *mut sys::rdma_conn_param,
) -> c_int {
    on_ctx(id, |ctx| {
        let p = conn_param(p);
        let user = private(&p);
        if (*id).qp_type == sys::IBV_QPT_UD {
            return sidr_connect(ctx, id, user);
        }
        let Some((src, dst, pd)) = request_private::<92>(id, user) else {
            return fail(libc::EINVAL, -1);
        };
        let qpn = qp_num(id, &p);
        let my_rq_psn = start_conn(id, &p);
        let mtu = active_mtu((*id).verbs);
        {
            let mut s = st(id);
            s.path_mtu = mtu;
            s.retry_count = p.retry_count;
            s.rnr_retry_count = p.rnr_retry_count;
        }
        let params = ConnectParams {
            service_id: service_id((*id).ps as u16, dst.port()),
            local_gid: gid_of(*src.ip()),
            remote_gid: gid_of(*dst.ip()),
            qpn,
            starting_psn: my_rq_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            path_mtu: mtu,
            retry_count: p.retry_count.min(7),
            rnr_retry_count: p.rnr_retry_count.min(7),
            hop_limit: 64,
            srq: p.srq != 0,
            private_data: pd,
            ..Default::default()
        };
        let r = client(ctx).cm_connect(params);
        opened(id, r)
    })
}

/// The ID's source and destination and the private data of its request: rdma_cm's
/// addressing header, then the application's `user` bytes; `None` without both addresses or
/// when `user` does not fit after the header.
unsafe fn request_private<const N: usize>(
    id: *mut sys::rdma_cm_id,
    user: &[u8],
) -> Option<(SocketAddrV4, SocketAddrV4, PrivateData<N>)> {
    let (src, dst) = {
        let s = st(id);
        (s.src?, s.dst?)
    };
    let hdr = CmaHeader {
        src: src.into(),
        dst: (*dst.ip()).into(),
    };
    Some((src, dst, hdr.private_data(user)?))
}

/// Records the connection (or SIDR request) `r` opened for the ID; a synchronous ID then
/// waits for ESTABLISHED.
unsafe fn opened(id: *mut sys::rdma_cm_id, r: Result<u32, VerbsError>) -> c_int {
    match r {
        Ok(cid) => {
            st(id).conn = Some(cid);
            reg().conns.insert(((*id).verbs as usize, cid), id as usize);
            if is_sync(id) {
                return wait_for(id, sys::RDMA_CM_EVENT_ESTABLISHED);
            }
            0
        }
        Err(e) => fail(verr(&e), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_accept(
    id: *mut sys::rdma_cm_id,
    p: *mut sys::rdma_conn_param,
) -> c_int {
    on_ctx(id, |ctx| {
        let p = accept_param(id, p);
        let Some(cid) = st(id).conn else {
            return fail(libc::EINVAL, -1);
        };
        if (*id).qp_type == sys::IBV_QPT_UD {
            // The SIDR_REP names the ID's UD QP (or the application's qp_num) and rdma_cm's
            // Q_Key; the request is then done.
            let qpn = qp_num(id, &p);
            let r = client(ctx).cm_sidr_reply(cid, SIDR_VALID, qpn, UDP_QKEY, private(&p));
            st(id).conn = None;
            reg().conns.remove(&((*id).verbs as usize, cid));
            return match r {
                Ok(()) => 0,
                Err(e) => fail(verr(&e), -1),
            };
        }
        let my_rq_psn = start_conn(id, &p);
        let qpn = qp_num(id, &p);
        if !(*id).qp.is_null()
            && (move_qp(id, sys::IBV_QPS_RTR) != 0 || move_qp(id, sys::IBV_QPS_RTS) != 0)
        {
            return fail(libc::EINVAL, -1);
        }
        let Some(private_data) = PrivateData::from_bytes(private(&p)) else {
            return fail(libc::EINVAL, -1);
        };
        let params = AcceptParams {
            qpn,
            starting_psn: my_rq_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq != 0,
            private_data,
        };
        let r = client(ctx).cm_accept(cid, params);
        match r {
            Ok(()) => {
                if is_sync(id) {
                    // The request rdma_get_request handed out is answered now (an
                    // asynchronous application acks its own events).
                    let ev = (*id).event;
                    if !ev.is_null() && (*ev).event == sys::RDMA_CM_EVENT_CONNECT_REQUEST {
                        ferroce_rdma_ack_cm_event(ev);
                    }
                    return wait_for(id, sys::RDMA_CM_EVENT_ESTABLISHED);
                }
                0
            }
            Err(e) => fail(verr(&e), -1),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_reject(
    id: *mut sys::rdma_cm_id,
    pd: *const c_void,
    len: u8,
) -> c_int {
    on_ctx(id, |ctx| {
        let Some(cid) = st(id).conn.take() else {
            return fail(libc::EINVAL, -1);
        };
        let data = if pd.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(pd as *const u8, len as usize)
        };
        reg().conns.remove(&((*id).verbs as usize, cid));
        match client(ctx).cm_reject(cid, data) {
            Ok(()) => 0,
            Err(e) => fail(verr(&e), -1),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_establish(id: *mut sys::rdma_cm_id) -> c_int {
    guard_id(id, -1, || {
        let (Some(ctx), Some(cid)) = (context(id), st(id).conn) else {
            return fail(libc::EINVAL, -1);
        };
        match client(ctx).cm_rtu(cid) {
            Ok(()) => 0,
            Err(e) => fail(verr(&e), -1),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_disconnect(id: *mut sys::rdma_cm_id) -> c_int {
    on_ctx(id, |ctx| {
        let _ = move_qp(id, sys::IBV_QPS_ERR);
        let (conn, done) = {
            let s = st(id);
            (s.conn, s.disconnected)
        };
        let Some(cid) = conn else {
            return fail(libc::EINVAL, -1);
        };
        if done {
            // The peer disconnected first: nothing more to say.
            return 0;
        }
        let r = client(ctx).cm_disconnect(cid);
        match r {
            Ok(()) => 0,
            // Not established any more: the peer's DREQ got here first (its DISCONNECTED
            // event is on its way) - the connection is going down, as asked.
            Err(VerbsError::InvalidArgument(_)) => 0,
            Err(e) => fail(verr(&e), -1),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_cm_event(
    ch: *mut sys::rdma_event_channel,
    ev: *mut *mut sys::rdma_cm_event,
) -> c_int {
    guard(-1, || {
        if !live_channel(ch) || ev.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let c = ch as *mut Channel;
        // One count per queued event: blocks (or EAGAIN on a non-blocking fd) until one is.
        loop {
            if count_down((*c).efd.as_raw_fd()) {
                break;
            }
            let e = *libc::__errno_location();
            if e != libc::EINTR {
                return fail(e, -1);
            }
        }
        let Some(e) = (*c)
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
        else {
            return fail(libc::EAGAIN, -1);
        };
        let e = e as *mut Event;
        (*(*e).ev.id).event = &mut (*e).ev;
        *ev = &mut (*e).ev;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_ack_cm_event(ev: *mut sys::rdma_cm_event) -> c_int {
    guard(-1, || {
        if ev.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let id = (*ev).id;
        if !id.is_null() && (*id).event == ev {
            (*id).event = std::ptr::null_mut();
        }
        drop(Box::from_raw(ev as *mut Event));
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_init_qp_attr(
    id: *mut sys::rdma_cm_id,
    attr: *mut sys::ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard_id(id, -1, || {
        if attr.is_null() || mask.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let state = (*attr).qp_state;
        init_qp_attr(id, state, &mut *attr, &mut *mask)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_migrate_id(
    id: *mut sys::rdma_cm_id,
    ch: *mut sys::rdma_event_channel,
) -> c_int {
    guard_id(id, -1, || {
        // No channel: the ID becomes synchronous, with a channel of its own (librdmacm).
        let Some((ch, sync)) = channel_or_own(ch) else {
            return fail(libc::EINVAL, -1);
        };
        let old = (*id).channel;
        // No event is dispatched to it meanwhile: one dispatched after the move but before
        // the switch would land on the old channel.
        let _d = dispatching();
        if old != ch && live_channel(old) {
            // The events queued for it go with it (the kernel's ucma_migrate_id moves them
            // to the new file), in order, a listener's connect requests among them. The old
            // channel's eventfd keeps their counts (taking one could block against a reader
            // that holds it): a reader there finds its queue short, EAGAIN.
            let oc = old as *mut Channel;
            let mut moved = Vec::new();
            (*oc)
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|e| {
                    let ev = &(*(*e as *const Event)).ev;
                    let mine = ev.id == id || ev.listen_id == id;
                    if mine {
                        moved.push(*e);
                    }
                    !mine
                });
            for e in moved {
                queue(ch, Box::from_raw(e as *mut Event));
            }
        }
        (*id).channel = ch;
        // A synchronous ID's own channel was its alone: it goes (librdmacm).
        if std::mem::replace(&mut st(id).sync, sync) && old != ch {
            ferroce_rdma_destroy_event_channel(old);
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_set_option(
    _id: *mut sys::rdma_cm_id,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    // Timeouts, TOS and reuse options: the connection manager's defaults stand.
    0
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_event_str(event: u32) -> *const c_char {
    let s: &'static [u8] = match event {
        sys::RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        sys::RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        sys::RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        sys::RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        sys::RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        sys::RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        sys::RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        sys::RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        sys::RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        sys::RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        sys::RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        sys::RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        sys::RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        sys::RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        sys::RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        sys::RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const sys::rdma_addrinfo,
    res: *mut *mut sys::rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let mut h: libc::addrinfo = std::mem::zeroed();
        h.ai_family = libc::AF_INET;
        h.ai_socktype = libc::SOCK_STREAM;
        let passive = !hints.is_null() && (*hints).ai_flags & sys::RAI_PASSIVE as c_int != 0;
        if passive {
            h.ai_flags |= libc::AI_PASSIVE;
        }
        if !hints.is_null() && (*hints).ai_flags & sys::RAI_NUMERICHOST as c_int != 0 {
            h.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut found: *mut libc::addrinfo = std::ptr::null_mut();
        let r = libc::getaddrinfo(node, service, &h, &mut found);
        if r != 0 || found.is_null() {
            return fail(libc::EADDRNOTAVAIL, -1);
        }
        let sa = libc::calloc(1, std::mem::size_of::<sys::sockaddr_in>()) as *mut sys::sockaddr;
        let ai =
            libc::calloc(1, std::mem::size_of::<sys::rdma_addrinfo>()) as *mut sys::rdma_addrinfo;
        if sa.is_null() || ai.is_null() {
            libc::freeaddrinfo(found);
            return fail(libc::ENOMEM, -1);
        }
        std::ptr::copy_nonoverlapping(
            (*found).ai_addr as *const u8,
            sa as *mut u8,
            std::mem::size_of::<sys::sockaddr_in>(),
        );
        libc::freeaddrinfo(found);
        (*ai).ai_family = libc::AF_INET;
        (*ai).ai_flags = if hints.is_null() {
            0
        } else {
            (*hints).ai_flags
        };
        (*ai).ai_qp_type = if hints.is_null() || (*hints).ai_qp_type == 0 {
            sys::IBV_QPT_RC as c_int
        } else {
            (*hints).ai_qp_type
        };
        (*ai).ai_port_space = if hints.is_null() || (*hints).ai_port_space == 0 {
            sys::RDMA_PS_TCP as c_int
        } else {
            (*hints).ai_port_space
        };
        let len = std::mem::size_of::<sys::sockaddr_in>() as u32;
        if passive {
            (*ai).ai_src_addr = sa;
            (*ai).ai_src_len = len;
        } else {
            (*ai).ai_dst_addr = sa;
            (*ai).ai_dst_len = len;
        }
        *res = ai;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_freeaddrinfo(res: *mut sys::rdma_addrinfo) {
    let mut ai = res;
    while !ai.is_null() {
        let next = (*ai).ai_next;
        libc::free((*ai).ai_src_addr as *mut c_void);
        libc::free((*ai).ai_dst_addr as *mut c_void);
        libc::free(ai as *mut c_void);
        ai = next;
    }
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // rsocket's poll on ordinary descriptors (rping polls its event channel with it).
    libc::poll(fds, nfds, timeout)
}

/// A synchronous ID's call waits for `want` on the ID's own channel; another event there
/// that ends the attempt (rejected, unreachable, an error) fails the call with `errno`.
unsafe fn wait_for(id: *mut sys::rdma_cm_id, want: u32) -> c_int {
    loop {
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        if ferroce_rdma_get_cm_event((*id).channel, &mut ev) != 0 {
            return -1;
        }
        let (kind, status) = ((*ev).event, (*ev).status);
        ferroce_rdma_ack_cm_event(ev);
        // A connect without a QP ends its wait at CONNECT_RESPONSE: the application
        // finishes with rdma_establish (librdmacm's ucma_complete takes the first event).
        if kind == want
            || (want == sys::RDMA_CM_EVENT_ESTABLISHED
                && kind == sys::RDMA_CM_EVENT_CONNECT_RESPONSE)
        {
            return 0;
        }
        // The event's own status when it carries one (ADDR_ERROR's -ETIMEDOUT or
        // -EHOSTUNREACH), as ucma_complete.
        if status < 0 && kind != sys::RDMA_CM_EVENT_REJECTED {
            return fail(-status, -1);
        }
        let e = match kind {
            sys::RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
            sys::RDMA_CM_EVENT_UNREACHABLE => libc::ETIMEDOUT,
            sys::RDMA_CM_EVENT_ADDR_ERROR | sys::RDMA_CM_EVENT_ROUTE_ERROR => libc::EHOSTUNREACH,
            sys::RDMA_CM_EVENT_CONNECT_ERROR | sys::RDMA_CM_EVENT_DISCONNECTED => libc::ECONNRESET,
            _ => continue,
        };
        return fail(e, -1);
    }
}

/// Whether the ID is synchronous.
fn is_sync(id: *mut sys::rdma_cm_id) -> bool {
    st(id).sync
}

/// The QP of an endpoint: the application's attributes, with a send and a receive CQ (each
/// with its own completion channel, the ID as their context, as `rdma_get_*_comp` expect)
/// made when it gave none.
unsafe fn endpoint_qp(
    id: *mut sys::rdma_cm_id,
    pd: *mut sys::ibv_pd,
    attr: &sys::ibv_qp_init_attr,
) -> c_int {
    let mut a = *attr;
    if a.qp_type == 0 {
        // Not set: the ID's (from the address information), as librdmacm does.
        a.qp_type = (*id).qp_type;
    }
    // CQs the attributes do not name are made by rdma_create_qp.
    ferroce_rdma_create_qp(id, pd, &mut a)
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_create_ep(
    id: *mut *mut sys::rdma_cm_id,
    res: *mut sys::rdma_addrinfo,
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL, -1);
        }
        let ps = if (*res).ai_port_space == 0 {
            sys::RDMA_PS_TCP
        } else {
            (*res).ai_port_space as u32
        };
        let mut new: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // A synchronous ID: its own channel, its calls waiting for their events.
        if ferroce_rdma_create_id(std::ptr::null_mut(), &mut new, std::ptr::null_mut(), ps) != 0 {
            return -1;
        }
        if (*res).ai_qp_type != 0 {
            (*new).qp_type = (*res).ai_qp_type as u32;
        }
        let passive = (*res).ai_flags & sys::RAI_PASSIVE as c_int != 0;
        let ok = if passive {
            ferroce_rdma_bind_addr(new, (*res).ai_src_addr) == 0
        } else {
            ferroce_rdma_resolve_addr(new, (*res).ai_src_addr, (*res).ai_dst_addr, 2000) == 0
                && ferroce_rdma_resolve_route(new, 2000) == 0
        };
        if !ok {
            let e = *libc::__errno_location();
            ferroce_rdma_destroy_ep(new);
            return fail(e, -1);
        }
        if !attr.is_null() {
            if passive {
                // Kept for the IDs rdma_get_request hands out.
                st(new).ep_qp = Some((*attr, pd as usize));
            } else if endpoint_qp(new, pd, &*attr) != 0 {
                let e = *libc::__errno_location();
                ferroce_rdma_destroy_ep(new);
                return fail(e, -1);
            }
        }
        *id = new;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_destroy_ep(id: *mut sys::rdma_cm_id) {
    guard_id(id, (), || {
        // The CQs the library made go with the QP.
        ferroce_rdma_destroy_qp(id);
        // A synchronous ID's own channel goes with it (`ferroce_rdma_destroy_id`).
        ferroce_rdma_destroy_id(id);
    })
}

#[no_mangle]
pub unsafe extern "C" fn ferroce_rdma_get_request(
    listen: *mut sys::rdma_cm_id,
    id: *mut *mut sys::rdma_cm_id,
) -> c_int {
    guard_id(listen, -1, || {
        if id.is_null() || !is_sync(listen) {
            return fail(libc::EINVAL, -1);
        }
        loop {
            let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
            if ferroce_rdma_get_cm_event((*listen).channel, &mut ev) != 0 {
                return -1;
            }
            let (kind, child) = ((*ev).event, (*ev).id);
            if kind != sys::RDMA_CM_EVENT_CONNECT_REQUEST {
                ferroce_rdma_ack_cm_event(ev);
                continue;
            }
            // The request stays the child's event until it is answered (as librdmacm).
            (*child).event = ev;
            let ep = st(listen).ep_qp;
            if let Some((attr, pd)) = ep {
                if endpoint_qp(child, pd as *mut sys::ibv_pd, &attr) != 0 {
                    let e = *libc::__errno_location();
                    let _ = ferroce_rdma_reject(child, std::ptr::null(), 0);
                    ferroce_rdma_ack_cm_event(ev);
                    ferroce_rdma_destroy_ep(child);
                    return fail(e, -1);
                }
            }
            *id = child;
            return 0;
        }
    })
}

/// rdma_connect on a UD ID: a SIDR request for the service (rdma_cm's addressing header,
/// then the application's private data); ESTABLISHED carries the service's QP and Q_Key.
unsafe fn sidr_connect(ctx: &Ctx, id: *mut sys::rdma_cm_id, user: &[u8]) -> c_int {
    let Some((src, dst, pd)) = request_private::<216>(id, user) else {
        return fail(libc::EINVAL, -1);
    };
    let params = SidrParams {
        service_id: service_id((*id).ps as u16, dst.port()),
        local_gid: gid_of(*src.ip()),
        remote_gid: gid_of(*dst.ip()),
        private_data: pd,
    };
    let r = client(ctx).cm_sidr_request(params);
    opened(id, r)
}
