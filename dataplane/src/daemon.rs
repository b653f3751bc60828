//! rnicd's host interface: a Unix socket through which applications in other processes
//! attach to the RNICs of a [`Runtime`] (docs/host-protocol.md).
//!
//! One thread accepts connections; each connection gets a thread that reads its requests,
//! maps the memfds it sends (only if sealed against shrinking), hands its verbs calls to the
//! worker as `Control::Call` and writes the replies. The worker runs posts straight from the
//! client's shared rings, so the socket carries control calls only, never a work request.
//! When a connection ends - the application closed it, exited or was killed - its objects
//! are released on the worker (`Control::Close`): QPs destroyed first, then MRs (so no frame
//! touches memory after its MR is gone), then the areas are unmapped.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::HostConfig;
use crate::local::LocalChannel;
use crate::nic::NicReport;
use crate::runtime::Runtime;
use crate::worker::{Control, NicSnapshot};
use ferroce_host::abi::area::Area;
use ferroce_host::abi::proto::{
    AdminRequest, Body, ClientRes, DeviceInfo, DeviceStats, Hello, Listener, ObjRes, PeerCred,
    QpRes, Reply, ReplyBody, Request, Resources, Role, SeqPacket, Welcome, WireError, MAX_MESSAGE,
    VERSION,
};
use ferroce_host::abi::ring::ring_bytes;
use ferroce_host::abi::slots::{CqeSlot, EventSlot, PostCell};
use ferroce_host::abi::{ClientLimits, Command};
use ferroce_host::Channel;

/// How long a new connection has to say hello.
const HELLO_PATIENCE: Duration = Duration::from_secs(5);
/// How long an admin connection may stay idle.
const ADMIN_IDLE: Duration = Duration::from_secs(60);
/// How often idle threads look at the stop flag.
const TICK: Duration = Duration::from_millis(100);
/// The largest CQ ring a client may send (slots).
const MAX_CQ_RING: u32 = 1 << 22;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Another rnicd answers on the socket.
    #[error("another rnicd is running on {0} (stop it first, or set host.socket)")]
    InUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket; not replacing it")]
    NotASocket(PathBuf),
    /// The socket group does not exist.
    #[error("host.group {0:?}: no such group")]
    NoGroup(String),
    /// Anything else.
    #[error("{0}: {1}")]
    Io(String, io::Error),
}

/// State every connection thread shares.
struct Shared {
    rt: Runtime,
    names: Vec<String>,
    ports: Vec<String>,
    speeds: Vec<u32>,
    /// Per RNIC.
    client_limits: Vec<ClientLimits>,
    max_clients: u32,
    clients: AtomicU32,
    /// Connections open (any role, hello or not).
    conns: AtomicU32,
    /// No more connections.
    stop_accept: AtomicBool,
    /// Connections end (set after the worker has failed every client's QPs).
    stop: AtomicBool,
}

/// A running rnicd host interface over a runtime's RNICs.
pub struct Daemon {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    socket: PathBuf,
}

/// Raises the soft limit on open descriptors to the hard limit. rnicd holds one descriptor
/// per connection (and briefly one per memfd in flight); the common soft default of 1024
/// would cap the clients well below `host.max_clients` under a burst of connections.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 && rl.rlim_cur < rl.rlim_max {
        let old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } == 0 {
            tracing::debug!(from = old, to = rl.rlim_max, "raised the descriptor limit");
        }
    }
}

/// Looks up a group id by name.
fn group_id(name: &str) -> Option<libc::gid_t> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: zero is a valid group struct; getgrnam_r writes into buf within its length.
    let mut g: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    let r = unsafe { libc::getgrnam_r(c.as_ptr(), &mut g, buf.as_mut_ptr(), buf.len(), &mut out) };
    (r == 0 && !out.is_null()).then_some(g.gr_gid)
}

/// Fails if a live rnicd already answers on `cfg`'s socket (checked before the RNICs start,
/// so a second rnicd never touches the ports of the first).
pub fn check_socket(cfg: &HostConfig) -> Result<(), DaemonError> {
    use std::os::unix::fs::FileTypeExt;
    let path = &cfg.socket;
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(DaemonError::NotASocket(path.clone())),
        Ok(_) if SeqPacket::connect(path).is_ok() => Err(DaemonError::InUse(path.clone())),
        _ => Ok(()),
    }
}

/// Makes the listening socket: refuses if a live rnicd answers there, replaces a stale
/// socket file, applies the mode and group.
fn listen(cfg: &HostConfig) -> Result<Listener, DaemonError> {
    let path = &cfg.socket;
    let io_err = |what: &str, e| DaemonError::Io(format!("{what} {}", path.display()), e);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| DaemonError::Io(format!("cannot create {}", dir.display()), e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) => {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(DaemonError::NotASocket(path.clone()));
            }
            match SeqPacket::connect(path) {
                Ok(_) => return Err(DaemonError::InUse(path.clone())),
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    // Nobody listens: a socket left by an rnicd that did not exit cleanly.
                    tracing::info!(socket = %path.display(), "replacing a stale socket");
                    std::fs::remove_file(path).map_err(|e| io_err("cannot remove", e))?;
                }
                Err(e) => return Err(io_err("cannot probe the existing socket", e)),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("cannot inspect", e)),
    }
    let gid = match &cfg.group {
        Some(g) => Some(group_id(g).ok_or_else(|| DaemonError::NoGroup(g.clone()))?),
        None => None,
    };
    // Bound under a temporary name, given its mode and group, then renamed into place: no
    // moment where the socket is reachable with the umask's permissions.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let l = Listener::bind(&tmp).map_err(|e| io_err("cannot listen on", e))?;
    let setup = || -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(cfg.mode))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&tmp, None, Some(gid))?;
        }
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = setup() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err("cannot set up", e));
    }
    Ok(l)
}

impl Daemon {
    /// Serves `rt`'s RNICs (named `ferroce0`, `ferroce1`, ... in order) on the socket of
    /// `cfg`.
    pub fn start(rt: Runtime, cfg: &HostConfig) -> Result<Daemon, DaemonError> {
        raise_fd_limit();
        let listener = listen(cfg)?;
        let n = rt.len();
        let client_limits = (0..n)
            .map(|i| cfg.client_limits(&rt.device_limits(i)))
            .collect();
        let shared = Arc::new(Shared {
            names: (0..n).map(|i| format!("ferroce{i}")).collect(),
            ports: (0..n).map(|i| rt.config(i).device.clone()).collect(),
            speeds: (0..n).map(|i| rt.config(i).speed_gbps).collect(),
            rt,
            client_limits,
            max_clients: cfg.max_clients,
            clients: AtomicU32::new(0),
            conns: AtomicU32::new(0),
            stop_accept: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (s2, c2) = (shared.clone(), conns.clone());
        let accept = std::thread::Builder::new()
            .name("rnicd-accept".into())
            .spawn(move || accept_loop(listener, s2, c2))
            .map_err(|e| DaemonError::Io("cannot start the accept thread".into(), e))?;
        Ok(Daemon {
            shared,
            accept: Some(accept),
            conns,
            socket: cfg.socket.clone(),
        })
    }

    /// The runtime (counters, configuration).
    pub fn runtime(&self) -> &Runtime {
        &self.shared.rt
    }

    /// The RNICs' names.
    pub fn names(&self) -> &[String] {
        &self.shared.names
    }

    /// Clients attached now.
    pub fn clients(&self) -> u32 {
        self.shared.clients.load(Ordering::Relaxed)
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops: every client's QPs go to the error state and clients get the device-fatal
    /// event (the worker does this as it stops), then their connections close and the
    /// socket is removed. Returns the RNICs' final counters.
    pub fn stop(mut self) -> Vec<NicSnapshot> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Vec<NicSnapshot> {
        self.shared.stop_accept.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // The worker fails every client's QPs and sends the event before it exits (the
        // connections are still open, so no client is closed - and its QPs destroyed without
        // a flush - before that)...
        let snaps = self.shared.rt.stop_worker();
        // ...then the connections end (clients see the socket hang up).
        self.shared.stop.store(true, Ordering::Release);
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|p| p.into_inner()));
        for c in conns {
            let _ = c.join();
        }
        let _ = std::fs::remove_file(&self.socket);
        snaps
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.shutdown();
        }
    }
}

fn accept_loop(l: Listener, shared: Arc<Shared>, conns: Arc<Mutex<Vec<JoinHandle<()>>>>) {
    while !shared.stop_accept.load(Ordering::Acquire) {
        if !shared.rt.alive() {
            // The worker died: end every connection so clients see rnicd gone (their
            // contexts turn device-fatal) instead of waiting on a dead RNIC.
            tracing::error!("the worker stopped: closing every client connection");
            shared.stop.store(true, Ordering::Release);
            break;
        }
        let conn = match l.accept(TICK) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(TICK);
                continue;
            }
        };
        // Each connection costs a thread until it says hello (or 5 s): bounded.
        let cap = shared.max_clients.saturating_mul(2).saturating_add(16);
        if shared.conns.load(Ordering::Acquire) >= cap {
            tracing::warn!(cap, "too many connections: refusing one");
            let _ = conn.send_json(
                &Reply::err(0, WireError::NoResources("connections".into())),
                &[],
            );
            continue;
        }
        shared.conns.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("rnicd-client".into())
            .spawn(move || {
                serve(conn, &s);
                s.conns.fetch_sub(1, Ordering::AcqRel);
            });
        let mut list = conns.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|h| !h.is_finished());
        match spawned {
            Ok(h) => list.push(h),
            Err(e) => {
                shared.conns.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(error = %e, "cannot start a client thread")
            }
        }
    }
}

/// The command name of `pid` (/proc/PID/comm), or "?".
fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A request with its fds, or why it could not be read (with its id when known).
type Incoming = Result<(Request, Vec<OwnedFd>), (u64, WireError)>;

/// Waits for the next request; `None` when the connection ended or the daemon stops.
fn next(
    conn: &SeqPacket,
    shared: &Shared,
    buf: &mut [u8],
    patience: Option<Duration>,
) -> Option<Incoming> {
    let start = Instant::now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return None;
        }
        if patience.is_some_and(|p| start.elapsed() > p) {
            return None;
        }
        match ferroce_host::abi::proto::wait_readable(conn.raw(), Some(TICK)) {
            Ok(true) => break,
            Ok(false) => continue,
            Err(_) => return None,
        }
    }
    match conn.recv(buf) {
        Ok((0, _)) => None,
        Ok((n, fds)) => Some(match serde_json::from_slice::<Request>(&buf[..n]) {
            Ok(r) => Ok((r, fds)),
            Err(e) => {
                // Echo the id if there is one, so the client can match the error.
                let id = serde_json::from_slice::<serde_json::Value>(&buf[..n])
                    .ok()
                    .and_then(|v| v.get("id").and_then(|i| i.as_u64()))
                    .unwrap_or(0);
                Err((id, WireError::Protocol(format!("bad request: {e}"))))
            }
        }),
        // Too long, too many fds: answered, and the connection goes on.
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            Some(Err((0, WireError::Protocol(e.to_string()))))
        }
        Err(_) => None,
    }
}

/// One connection, from hello to close.
fn serve(conn: SeqPacket, shared: &Shared) {
    let cred = conn.peer_cred().ok();
    let pid = cred.map_or(0, |c| c.pid);
    let comm = comm_of(pid);
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (id, hello) = match next(&conn, shared, &mut buf, Some(HELLO_PATIENCE)) {
        Some(Ok((
            Request {
                id,
                body: Body::Hello(h),
            },
            _,
        ))) => (id, h),
        Some(Ok((r, _))) => {
            let _ = conn.send_json(
                &Reply::err(
                    r.id,
                    WireError::Protocol("the first message must be a hello".into()),
                ),
                &[],
            );
            return;
        }
        Some(Err((id, e))) => {
            let _ = conn.send_json(&Reply::err(id, e), &[]);
            return;
        }
        None => return,
    };
    if hello.version != VERSION {
        let e = WireError::Protocol(format!(
            "protocol version {} is not supported (this rnicd speaks {VERSION})",
            hello.version
        ));
        let mut r = Reply::err(id, e);
        r.status = libc::EPROTONOSUPPORT;
        let _ = conn.send_json(&r, &[]);
        return;
    }
    tracing::info!(
        pid,
        uid = cred.map_or(u32::MAX, |c| c.uid),
        comm = %comm,
        program = %hello.program,
        role = ?hello.role,
        device = ?hello.device,
        "client connected"
    );
    match hello.role {
        Role::Admin => {
            let w = welcome(shared, 0, &shared.client_limits[0]);
            if conn
                .send_json(&Reply::ok(id, ReplyBody::Welcome(w)), &[])
                .is_ok()
            {
                admin_loop(&conn, shared, &mut buf, cred);
            }
        }
        Role::Verbs => verbs_client(conn, shared, id, &hello, cred, &comm, &mut buf),
    }
    tracing::info!(pid, comm = %comm, "client disconnected");
}

fn welcome(shared: &Shared, nic: usize, client_limits: &ClientLimits) -> Welcome {
    let limits = shared.rt.host_limits(nic);
    Welcome {
        version: VERSION,
        device: shared.names[nic].clone(),
        devices: shared.names.clone(),
        limits,
        client_limits: *client_limits,
        ring_bytes: [
            ring_bytes::<PostCell>(ferroce_host::abi::POST_RING) as u64,
            ring_bytes::<EventSlot>(ferroce_host::abi::EVENT_RING) as u64,
            limits.index_bytes() as u64,
        ],
        daemon_pid: std::process::id(),
    }
}

/// Counts a client in; false (and nothing counted) when `host.max_clients` are attached.
fn admit(shared: &Shared) -> bool {
    shared
        .clients
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < shared.max_clients).then_some(n + 1)
        })
        .is_ok()
}

fn verbs_client(
    conn: SeqPacket,
    shared: &Shared,
    id: u64,
    hello: &Hello,
    cred: Option<PeerCred>,
    comm: &str,
    buf: &mut [u8],
) {
    let pid = cred.map_or(0, |c| c.pid);
    let nic = match &hello.device {
        None => Some(0),
        Some(d) => shared.names.iter().position(|n| n == d),
    };
    let Some(nic) = nic else {
        let e = WireError::NotFound(format!(
            "device {:?} (this rnicd has {})",
            hello.device.as_deref().unwrap_or(""),
            shared.names.join(", ")
        ));
        let mut r = Reply::err(id, e);
        r.status = libc::ENODEV;
        let _ = conn.send_json(&r, &[]);
        return;
    };
    if !admit(shared) {
        let e = WireError::NoResources("clients (host.max_clients)".into());
        let _ = conn.send_json(&Reply::err(id, e), &[]);
        return;
    }
    let limits = shared.client_limits[nic];
    let attached = shared
        .rt
        .attach_host(nic, limits, pid, cred.map_or(u32::MAX, |c| c.uid), comm);
    let (rings, mut chan) = match attached {
        Ok(x) => x,
        Err(e) => {
            shared.clients.fetch_sub(1, Ordering::AcqRel);
            let _ = conn.send_json(&Reply::err(id, WireError::Protocol(e.to_string())), &[]);
            return;
        }
    };
    let areas = [&rings.posts, &rings.events, &rings.index];
    let ok = match areas
        .iter()
        .map(|a| a.dup_fd())
        .collect::<io::Result<Vec<_>>>()
    {
        Ok(dups) => {
            let fds: Vec<_> = dups.iter().map(|d| d.as_fd()).collect();
            conn.send_json(
                &Reply::ok(id, ReplyBody::Welcome(welcome(shared, nic, &limits))),
                &fds,
            )
            .is_ok()
        }
        Err(_) => false,
    };
    // Sent: rnicd keeps the mappings only, no descriptor per client ring.
    for a in areas {
        a.close_fd();
    }
    drop(rings);
    if ok {
        while let Some(req) = next(&conn, shared, buf, None) {
            let (reply, close) = match req {
                Ok((r, fds)) => handle(shared, &mut chan, &limits, r, fds, cred),
                Err((id, e)) => (Reply::err(id, e), false),
            };
            if send_reply(&conn, reply).is_err() || close {
                break;
            }
        }
    }
    // However the connection ended, the client's objects go (a process that dies has its
    // resources reclaimed, as the kernel does for a hardware RNIC).
    shared.rt.control(Control::Close {
        nic,
        token: chan.token(),
    });
    shared.clients.fetch_sub(1, Ordering::AcqRel);
}

/// Maps the memfd a call sent, within the client's memory limit.
fn take_area(fds: Vec<OwnedFd>, limits: &ClientLimits, min: usize) -> Result<Arc<Area>, WireError> {
    let mut it = fds.into_iter();
    let (Some(fd), None) = (it.next(), it.next()) else {
        return Err(WireError::Protocol(
            "this call takes exactly one memfd".into(),
        ));
    };
    // SAFETY: fstat into a zeroed struct on an fd we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(WireError::InvalidArgument(
            "the fd cannot be inspected".into(),
        ));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(WireError::InvalidArgument(
            "the fd is not a memfd (not a regular file)".into(),
        ));
    }
    let size = st.st_size.max(0) as u64;
    if size > limits.max_area_bytes {
        return Err(WireError::NoResources(
            "shared memory (host.max_area_bytes)".into(),
        ));
    }
    if size < min as u64 || size == 0 {
        return Err(WireError::InvalidArgument(format!(
            "the memfd holds {size} bytes, at least {min} needed"
        )));
    }
    Area::from_fd(fd, size as usize)
        .map(Arc::new)
        .map_err(|e| WireError::InvalidArgument(format!("memory area refused: {e}")))
}

/// Runs one request of a verbs client; returns the reply and whether to close.
fn handle(
    shared: &Shared,
    chan: &mut LocalChannel,
    limits: &ClientLimits,
    r: Request,
    fds: Vec<OwnedFd>,
    cred: Option<PeerCred>,
) -> (Reply, bool) {
    let id = r.id;
    match r.body {
        Body::Hello(_) => (
            Reply::err(id, WireError::Protocol("hello twice".into())),
            false,
        ),
        Body::Admin(_) if !fds.is_empty() => (
            Reply::err(
                id,
                WireError::Protocol("admin requests take no file descriptors".into()),
            ),
            false,
        ),
        Body::Admin(a) => (admin(shared, id, a, cred), false),
        Body::Call(cmd) => {
            let area = match &cmd {
                Command::AddArea { .. } => match take_area(fds, limits, 1) {
                    Ok(a) => Some(a),
                    Err(e) => return (Reply::err(id, e), false),
                },
                Command::CreateCq { capacity, .. } => {
                    if !capacity.is_power_of_two() || *capacity > MAX_CQ_RING {
                        return (
                            Reply::err(
                                id,
                                WireError::InvalidArgument(format!(
                                    "CQ ring capacity {capacity} is not a power of two up to {MAX_CQ_RING}"
                                )),
                            ),
                            false,
                        );
                    }
                    let min = ring_bytes::<CqeSlot>(*capacity as usize);
                    match take_area(fds, limits, min) {
                        Ok(a) => Some(a),
                        Err(e) => return (Reply::err(id, e), false),
                    }
                }
                _ => {
                    if !fds.is_empty() {
                        return (
                            Reply::err(
                                id,
                                WireError::Protocol(format!(
                                    "{} takes no file descriptors",
                                    cmd.name()
                                )),
                            ),
                            false,
                        );
                    }
                    None
                }
            };
            let close = matches!(cmd, Command::Close);
            let reply = match chan.call(cmd, area) {
                Ok(d) => Reply::ok(id, ReplyBody::Call(d)),
                Err(e) => Reply::err(id, WireError::from(&e)),
            };
            (reply, close)
        }
    }
}

fn admin_loop(conn: &SeqPacket, shared: &Shared, buf: &mut [u8], cred: Option<PeerCred>) {
    // An idle management connection is closed: it holds a connection place.
    while let Some(req) = next(conn, shared, buf, Some(ADMIN_IDLE)) {
        let reply = match req {
            Ok((r, fds)) if !fds.is_empty() => Reply::err(
                r.id,
                WireError::Protocol("admin requests take no file descriptors".into()),
            ),
            Ok((
                Request {
                    id,
                    body: Body::Admin(a),
                },
                _,
            )) => admin(shared, id, a, cred),
            Ok((r, _)) => Reply::err(
                r.id,
                WireError::Protocol("an admin connection takes admin requests only".into()),
            ),
            Err((id, e)) => Reply::err(id, e),
        };
        if send_reply(conn, reply).is_err() {
            break;
        }
    }
}

/// Sends a reply; one too large for a message becomes an error reply saying so.
fn send_reply(conn: &SeqPacket, reply: Reply) -> io::Result<()> {
    let bytes = serde_json::to_vec(&reply).map_err(io::Error::other)?;
    if bytes.len() <= MAX_MESSAGE {
        return conn.send(&bytes, &[]);
    }
    let e = WireError::Protocol(format!(
        "the reply is {} bytes, more than a message holds ({MAX_MESSAGE}); ask for less \
         (e.g. counters without --qp)",
        bytes.len()
    ));
    conn.send_json(&Reply::err(reply.id, e), &[])
}

/// The workers' report of every RNIC.
fn inspect(shared: &Shared, qp_counters: bool) -> Result<Vec<NicReport>, WireError> {
    if !shared.rt.alive() {
        return Err(WireError::DeviceFatal);
    }
    shared
        .rt
        .inspect(qp_counters, Duration::from_secs(5))
        .ok_or(WireError::DeviceFatal)
}

fn mac_str(m: [u8; 6]) -> String {
    roce::wire::ethernet::mac_to_string(&m)
}

/// The node GUID as rxe derives it: the MAC as EUI-64 (ff:fe in the middle, U/L bit
/// flipped), printed as four groups.
fn node_guid(m: [u8; 6]) -> String {
    let g = [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    )
}

fn who(pid: u32, comm: &str) -> (u32, String) {
    if pid == 0 {
        // An in-process context of the daemon itself.
        (std::process::id(), comm_of(std::process::id()))
    } else {
        (pid, comm.to_string())
    }
}

fn admin(shared: &Shared, id: u64, req: AdminRequest, cred: Option<PeerCred>) -> Reply {
    let result = match req {
        AdminRequest::Devices => inspect(shared, false).map(|reps| {
            ReplyBody::Devices(
                reps.into_iter()
                    .enumerate()
                    .map(|(i, r)| DeviceInfo {
                        name: shared.names[i].clone(),
                        port: shared.ports[i].clone(),
                        mac: mac_str(r.mac),
                        node_guid: node_guid(r.mac),
                        active: r.port.active,
                        max_mtu: r.port.max_mtu.bytes(),
                        active_mtu: r.port.active_mtu.bytes(),
                        speed_gbps: shared.speeds[i],
                        gids: r.gids,
                        attr: r.attr,
                        clients: r.clients.len() as u32,
                    })
                    .collect(),
            )
        }),
        AdminRequest::Resources => inspect(shared, false).map(|reps| {
            // Keys and PSNs are what a peer needs to reach a client's memory or hijack its
            // connection: shown for a client only to the same user, root and rnicd's user.
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            let asker = cred.map(|c| c.uid);
            let privileged = asker.is_some_and(|u| u == 0 || u == me);
            let mut res = Resources::default();
            for (i, r) in reps.into_iter().enumerate() {
                let dev = &shared.names[i];
                for c in r.clients {
                    let (pid, comm) = who(c.pid, &c.comm);
                    let owner = if c.pid == 0 { me } else { c.uid };
                    let visible = privileged || asker == Some(owner);
                    res.clients.push(ClientRes {
                        device: dev.clone(),
                        pid,
                        // SAFETY: geteuid has no preconditions.
                        uid: if c.pid == 0 {
                            unsafe { libc::geteuid() }
                        } else {
                            c.uid
                        },
                        comm: comm.clone(),
                        area_bytes: c.area_bytes,
                    });
                    for q in &c.qps {
                        res.qps.push(QpRes {
                            device: dev.clone(),
                            pid,
                            comm: comm.clone(),
                            qpn: q.qpn.value(),
                            qp_type: q.qp_type,
                            state: q.state,
                            sq_psn: visible.then(|| q.attr.sq_psn.map_or(0, |p| p.value())),
                            rq_psn: visible.then(|| q.attr.rq_psn.map_or(0, |p| p.value())),
                            dest_qp: q.attr.dest_qp.map(|d| d.value()),
                            path_mtu: q.attr.path_mtu.map(|m| m.bytes()),
                            rate_kbps: q.rate_kbps,
                        });
                    }
                    let obj = |kind: &str, id: u32, size: u64, key: Option<u32>| ObjRes {
                        device: dev.clone(),
                        pid,
                        comm: comm.clone(),
                        kind: kind.into(),
                        id,
                        size,
                        key,
                    };
                    res.objects
                        .extend(c.pds.iter().map(|p| obj("pd", p.0, 0, None)));
                    res.objects
                        .extend(c.cqs.iter().map(|q| obj("cq", q.0, 0, None)));
                    res.objects
                        .extend(c.srqs.iter().map(|s| obj("srq", s.0, 0, None)));
                    res.objects.extend(
                        c.mrs
                            .iter()
                            .map(|(k, len)| obj("mr", k.index(), *len, visible.then_some(k.0))),
                    );
                }
            }
            ReplyBody::Resources(res)
        }),
        AdminRequest::Stats { qps } => inspect(shared, qps).map(|reps| {
            let mut all: Vec<DeviceStats> = reps
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    let snap = shared.rt.stats(i);
                    let port = snap
                        .nic
                        .iter()
                        .chain(snap.neigh.iter())
                        .chain(snap.dev.iter())
                        .chain(snap.qps.iter())
                        .chain(snap.gauges())
                        .map(|(k, v)| (k.to_string(), v))
                        .collect();
                    let qps = r
                        .clients
                        .iter()
                        .flat_map(|c| c.qp_counters.iter())
                        .map(|(q, c)| {
                            // Only non-zero counters per QP: the reply stays small.
                            let nz = c.iter().filter(|(_, v)| *v != 0);
                            (q.value(), nz.map(|(k, v)| (k.to_string(), v)).collect())
                        })
                        .collect();
                    DeviceStats {
                        device: shared.names[i].clone(),
                        port,
                        qps,
                        rnics: Vec::new(),
                    }
                })
                .collect();
            // Emulated switches (rnicd --loopback --switch-*, or an RNIC's [switch]).
            let mut i = 0;
            while let Some(s) = shared.rt.switch_stats(i) {
                all.push(DeviceStats {
                    device: format!("switch{i}"),
                    port: s.counters(),
                    qps: Vec::new(),
                    rnics: Vec::new(),
                });
                i += 1;
            }
            // Each worker thread's load, and the RNICs it drives.
            let mut w = 0;
            while let Some((load, rnics)) = shared.rt.worker_load(w) {
                all.push(DeviceStats {
                    device: format!("worker{w}"),
                    port: load.iter().map(|(k, v)| (k.to_string(), v)).collect(),
                    qps: Vec::new(),
                    rnics: rnics.iter().map(|&r| shared.names[r].clone()).collect(),
                });
                w += 1;
            }
            ReplyBody::Stats(all)
        }),
        // Switching capture writes files as rnicd: only root or rnicd's own user.
        // SAFETY: geteuid has no preconditions.
        AdminRequest::Capture { .. }
            if !cred.is_some_and(|c| c.uid == 0 || c.uid == unsafe { libc::geteuid() }) =>
        {
            Err(WireError::Permission(
                "switching capture needs root or rnicd's user".into(),
            ))
        }
        AdminRequest::Capture { device, on } => {
            match shared.names.iter().position(|n| *n == device) {
                None => Err(WireError::NotFound(format!("device {device:?}"))),
                Some(i) => {
                    if shared.rt.set_capture(i, on) {
                        Ok(ReplyBody::Done)
                    } else {
                        Err(WireError::InvalidArgument(format!(
                            "{device} has no capture file (set capture.pcap)"
                        )))
                    }
                }
            }
        }
    };
    match result {
        Ok(b) => Reply::ok(id, b),
        Err(e) => Reply::err(id, e),
    }
}
