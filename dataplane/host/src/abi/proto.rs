//! rnicd's control protocol (specified in docs/host-protocol.md): JSON messages, one per
//! packet of a `SOCK_SEQPACKET` Unix socket, with file descriptors (memfds of rings and memory
//! areas) attached as `SCM_RIGHTS`.
//!
//! A connection starts with a hello (protocol version, the RNIC wanted, the role); the daemon
//! answers with the RNIC's sizes and, for a verbs client, the fds of its post ring, event ring
//! and index area. Then each request carries an id and the reply the same id and an
//! errno-style status. Everything a peer sends is untrusted: a message that does not parse, is
//! too long, or carries fds where none belong gets an error reply (the fds are closed), never a
//! crash.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use roce::engine::VerbsError;
use roce::types::Gid;
use serde::{Deserialize, Serialize};

use crate::abi::{ClientLimits, Command, HostLimits, ReplyData};

/// The protocol version this build speaks (the hello carries it; a mismatch is refused with
/// EPROTONOSUPPORT).
pub const VERSION: u32 = 3;
/// Largest message, bytes.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most file descriptors one message carries.
pub const MAX_FDS: usize = 4;
/// Where rnicd listens unless configured otherwise (`host.socket`).
pub const DEFAULT_SOCKET: &str = "/run/ferroce/rnicd.sock";
/// The environment variable that overrides the default socket path for clients.
pub const SOCKET_ENV: &str = "FERROCE_SOCKET";

/// The socket path a client uses: `explicit`, else `$FERROCE_SOCKET`, else the default.
pub fn socket_path(explicit: Option<&Path>) -> std::path::PathBuf {
    match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os(SOCKET_ENV)
            .map(Into::into)
            .unwrap_or_else(|| DEFAULT_SOCKET.into()),
    }
}

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// An application using an RNIC (gets rings and runs verbs calls).
    Verbs,
    /// A management tool (rnic-ctl): admin requests only.
    Admin,
}

/// The first message of a connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// [`VERSION`].
    pub version: u32,
    /// The RNIC wanted (`ferroce0`...); `None`: the first.
    #[serde(default)]
    pub device: Option<String>,
    /// The role.
    pub role: Role,
    /// The client's program name (logged; the daemon also reads /proc for it).
    #[serde(default)]
    pub program: String,
}

/// The daemon's answer to a hello. A verbs client also gets three fds, in this order: its
/// post ring, its event ring and its index area.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    /// The daemon's protocol version.
    pub version: u32,
    /// The RNIC attached (verbs role).
    pub device: String,
    /// Every RNIC of the daemon.
    pub devices: Vec<String>,
    /// The RNIC's table sizes (the index area's layout).
    pub limits: HostLimits,
    /// What this client may hold.
    pub client_limits: ClientLimits,
    /// Bytes of the post ring, event ring and index area (each fd is checked against them).
    pub ring_bytes: [u64; 3],
    /// The daemon's process id.
    pub daemon_pid: u32,
}

/// A management request (rnic-ctl).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminRequest {
    /// Every RNIC: name, addresses, port state, GIDs.
    Devices,
    /// Every object of every client: owner, QP states and PSNs.
    Resources,
    /// Counters: every RNIC's port totals and, with `qps`, every QP's.
    Stats {
        /// Per-QP counters too.
        #[serde(default)]
        qps: bool,
    },
    /// Switches an RNIC's capture on or off.
    Capture {
        /// The RNIC.
        device: String,
        /// On or off.
        on: bool,
    },
}

/// A request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Body {
    /// The connection's first message.
    Hello(Hello),
    /// A verbs control call.
    Call(Command),
    /// A management request.
    Admin(AdminRequest),
}

/// A request and its id (echoed in the reply).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the client.
    pub id: u64,
    /// What is asked.
    #[serde(flatten)]
    pub body: Body,
}

/// A failed request: the errno and what the RNIC said, in a form that maps back to
/// [`VerbsError`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum WireError {
    /// EINVAL.
    InvalidArgument(String),
    /// ENOMEM: which resource.
    NoResources(String),
    /// ENOENT: which object.
    NotFound(String),
    /// EBUSY: which object.
    Busy(String),
    /// ENOMEM (as `ibv_post_send` on a full queue).
    QueueFull,
    /// EINVAL: the QP's state.
    InvalidState(roce::verbs::QpState),
    /// EINVAL: `modify_qp` refused, and why.
    Modify(String),
    /// EIO: the RNIC stopped.
    DeviceFatal,
    /// EPERM: the peer may not do this.
    Permission(String),
    /// EPROTO and others: the request itself was wrong (not JSON, unknown, fds missing).
    Protocol(String),
}

/// The names a `NotFound`, `NoResources` or `Busy` error can carry (they are `&'static str` in
/// [`VerbsError`]); an unknown one reads as "object".
const NAMES: &[&str] = &[
    "queue pair",
    "protection domain",
    "shared receive queue",
    "completion queue",
    "memory area",
    "memory region",
    "memory window",
    "memory windows",
    "context",
    "context (closed)",
    "device",
    "queue pairs",
    "completion queues",
    "shared receive queues",
    "memory regions",
    "protection domains",
    "queue pairs (host.max_qps)",
    "completion queues (host.max_cqs)",
    "memory regions (host.max_mrs)",
    "protection domains (host.max_pds)",
    "shared receive queues (host.max_srqs)",
    "shared memory (host.max_area_bytes)",
    "clients (host.max_clients)",
    "memory areas (host.max_areas)",
    "queue memory (host.max_queue_bytes)",
];

fn intern(s: &str) -> &'static str {
    NAMES.iter().find(|n| **n == s).copied().unwrap_or("object")
}

impl From<&VerbsError> for WireError {
    fn from(e: &VerbsError) -> WireError {
        match e {
            VerbsError::InvalidArgument(s) => WireError::InvalidArgument(s.clone()),
            VerbsError::NoResources(s) => WireError::NoResources((*s).into()),
            VerbsError::NotFound(s) => WireError::NotFound((*s).into()),
            VerbsError::Busy(s) => WireError::Busy((*s).into()),
            VerbsError::QueueFull => WireError::QueueFull,
            VerbsError::InvalidState(s) => WireError::InvalidState(*s),
            VerbsError::Modify(m) => WireError::Modify(m.to_string()),
            VerbsError::DeviceFatal => WireError::DeviceFatal,
            VerbsError::PermissionDenied(s) => WireError::Permission(s.clone()),
        }
    }
}

impl WireError {
    /// The errno a C caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            WireError::InvalidArgument(_) | WireError::InvalidState(_) | WireError::Modify(_) => {
                libc::EINVAL
            }
            WireError::NoResources(_) | WireError::QueueFull => libc::ENOMEM,
            WireError::NotFound(_) => libc::ENOENT,
            WireError::Busy(_) => libc::EBUSY,
            WireError::DeviceFatal => libc::EIO,
            WireError::Permission(_) => libc::EPERM,
            WireError::Protocol(_) => libc::EPROTO,
        }
    }

    /// The error as the verbs API reports it.
    pub fn into_verbs(self) -> VerbsError {
        match self {
            WireError::InvalidArgument(s) => VerbsError::InvalidArgument(s),
            WireError::NoResources(s) => VerbsError::NoResources(intern(&s)),
            WireError::NotFound(s) => VerbsError::NotFound(intern(&s)),
            WireError::Busy(s) => VerbsError::Busy(intern(&s)),
            WireError::QueueFull => VerbsError::QueueFull,
            WireError::InvalidState(s) => VerbsError::InvalidState(s),
            WireError::Modify(s) => VerbsError::Modify(roce::engine::ModifyError::Invalid(s)),
            WireError::DeviceFatal => VerbsError::DeviceFatal,
            WireError::Protocol(s) => VerbsError::InvalidArgument(format!("rnicd: {s}")),
            WireError::Permission(s) => VerbsError::PermissionDenied(s),
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The detail as rnicd sent it (into_verbs would reduce unknown names to "object").
        match self {
            WireError::Protocol(s) => write!(f, "protocol error: {s}"),
            WireError::Permission(s) => write!(f, "not permitted: {s}"),
            WireError::NotFound(s) => write!(f, "no such {s}"),
            WireError::NoResources(s) => write!(f, "out of resources: {s}"),
            WireError::Busy(s) => write!(f, "{s} is in use"),
            e => write!(f, "{}", e.clone().into_verbs()),
        }
    }
}

/// One RNIC as `rnic-ctl dev` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `ferroce0`...
    pub name: String,
    /// The DPDK port (devargs).
    pub port: String,
    /// MAC address.
    pub mac: String,
    /// Node GUID (EUI-64 from the MAC, as rxe derives it).
    pub node_guid: String,
    /// Port up.
    pub active: bool,
    /// Largest MTU, bytes.
    pub max_mtu: u32,
    /// Active MTU, bytes.
    pub active_mtu: u32,
    /// Link speed, Gb/s (the configured `port.speed_gbps`).
    pub speed_gbps: u32,
    /// GID table.
    pub gids: Vec<Gid>,
    /// Device attributes.
    pub attr: roce::engine::DeviceAttr,
    /// Clients attached.
    pub clients: u32,
}

/// One QP as `rnic-ctl res qp` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QpRes {
    /// RNIC.
    pub device: String,
    /// Owner's pid (rnicd's own for its in-process contexts).
    pub pid: u32,
    /// Owner's command name.
    pub comm: String,
    /// QP number.
    pub qpn: u32,
    /// Type.
    pub qp_type: roce::verbs::QpType,
    /// State.
    pub state: roce::verbs::QpState,
    /// Next send PSN (`None` when hidden: another user's QP, shown to neither root nor
    /// rnicd's own user).
    pub sq_psn: Option<u32>,
    /// Expected receive PSN (`None` when hidden, as `sq_psn`).
    pub rq_psn: Option<u32>,
    /// Destination QP.
    pub dest_qp: Option<u32>,
    /// Path MTU, bytes.
    pub path_mtu: Option<u32>,
    /// DCQCN's current rate for this QP, kb/s, while it holds the QP below line rate.
    #[serde(default)]
    pub rate_kbps: Option<u64>,
}

/// Objects other than QPs as `rnic-ctl res cq|mr|pd` shows them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjRes {
    /// RNIC.
    pub device: String,
    /// Owner's pid (rnicd's own for its in-process contexts).
    pub pid: u32,
    /// Owner's command name.
    pub comm: String,
    /// `pd`, `cq`, `mr` or `srq`.
    pub kind: String,
    /// Its handle (PD/CQ/SRQ id; an MR's index, `mrn`).
    pub id: u32,
    /// For an MR: its length in bytes (0 for other objects).
    #[serde(default)]
    pub size: u64,
    /// For an MR: its lkey (= rkey), shown only to its owner's user, root and rnicd's user
    /// (a key is what a peer needs to reach the memory, as `rdma resource` shows keys only
    /// to CAP_NET_ADMIN).
    #[serde(default)]
    pub key: Option<u32>,
}

/// One attached context (an application process) as `rnic-ctl res` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientRes {
    /// RNIC.
    pub device: String,
    /// Owner's pid (SO_PEERCRED; rnicd's own for its in-process contexts).
    pub pid: u32,
    /// Owner's uid (SO_PEERCRED).
    pub uid: u32,
    /// Owner's command name.
    pub comm: String,
    /// Bytes of memory it shares with the RNIC.
    pub area_bytes: u64,
}

/// Everything `rnic-ctl res` shows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Resources {
    /// Queue pairs.
    pub qps: Vec<QpRes>,
    /// PDs, CQs, MRs and SRQs.
    pub objects: Vec<ObjRes>,
    /// Attached contexts.
    pub clients: Vec<ClientRes>,
}

/// The entries of an RNIC's `DeviceStats::port` that are levels, not counts: they go down as
/// well as up, so tools show their value and no rate. In order: mbufs of the RNIC's pool in
/// use (received frames waiting, frames in flight, the receive rings' fill), attached
/// contexts, bytes of their shared memory the worker maps, and the engine's objects (as
/// `rdma resource show` counts them).
pub const STAT_GAUGES: [&str; 8] = [
    "mbufs_in_use",
    "clients",
    "area_bytes",
    "res_pd",
    "res_mr",
    "res_cq",
    "res_qp",
    "res_srq",
];

/// Counters of one RNIC, and of each of its QPs when asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceStats {
    /// RNIC (or `switchN`, an emulated switch; `workerN`, a worker thread).
    pub device: String,
    /// Port, neighbour, engine and QP-total counters, by name (a worker: its load).
    pub port: Vec<(String, u64)>,
    /// Per QP: (QPN, counters by name).
    pub qps: Vec<(u32, Vec<(String, u64)>)>,
    /// A worker's RNICs, by name (empty for an RNIC or a switch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rnics: Vec<String>,
}

/// What a request returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyBody {
    /// To a hello.
    Welcome(Welcome),
    /// To a verbs call.
    Call(ReplyData),
    /// To `AdminRequest::Devices`.
    Devices(Vec<DeviceInfo>),
    /// To `AdminRequest::Resources`.
    Resources(Resources),
    /// To `AdminRequest::Stats`.
    Stats(Vec<DeviceStats>),
    /// Done, nothing to return.
    Done,
}

/// A reply: the request's id, an errno-style status (0: success) and either the result or
/// the error.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// The request's id.
    pub id: u64,
    /// 0 or an errno.
    pub status: i32,
    /// The error (status != 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
    /// The result (status == 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ReplyBody>,
}

impl Reply {
    /// A success.
    pub fn ok(id: u64, data: ReplyBody) -> Reply {
        Reply {
            id,
            status: 0,
            error: None,
            data: Some(data),
        }
    }

    /// A failure.
    pub fn err(id: u64, e: WireError) -> Reply {
        Reply {
            id,
            status: e.errno(),
            error: Some(e),
            data: None,
        }
    }

    /// The result, as a verbs caller sees it.
    pub fn into_result(self) -> Result<ReplyBody, WireError> {
        match (self.status, self.error, self.data) {
            (0, _, Some(d)) => Ok(d),
            (_, Some(e), _) => Err(e),
            (s, None, _) => Err(WireError::Protocol(format!(
                "reply with status {s} and nothing else"
            ))),
        }
    }
}

/// A `SOCK_SEQPACKET` Unix socket: message boundaries kept, fds passed with messages.
#[derive(Debug)]
pub struct SeqPacket {
    fd: OwnedFd,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: zero is a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= a.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is too long (at most {} bytes) or has a NUL",
                path.display(),
                a.sun_path.len() - 1
            ),
        ));
    }
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((a, len as libc::socklen_t))
}

/// A new `SOCK_SEQPACKET` socket on which `call` (`connect(2)` or `bind(2)`) has been made
/// with the address `path`.
fn socket_at(
    path: &Path,
    call: unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked and owned.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let (a, len) = sockaddr(path)?;
    // SAFETY: a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        call(
            fd.as_raw_fd(),
            &a as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(fd)
}

/// A `msghdr` for one message in `iov`, without control data. The result points at `iov`.
fn msghdr(iov: &mut libc::iovec) -> libc::msghdr {
    // SAFETY: zero is a valid msghdr.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov;
    m.msg_iovlen = 1;
    m
}

/// Runs the system call `call` again while it fails with EINTR; its result (at least 0) or
/// its error.
fn retry_eintr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let r = call();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Waits until `fd` is readable (or hung up) for at most `timeout` (`None`: forever);
/// false on timeout. EINTR counts as a timeout (callers check their stop flag).
pub fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0)
}

/// The credentials of a socket's peer (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl SeqPacket {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> io::Result<SeqPacket> {
        let fd = socket_at(path, libc::connect)?;
        Ok(SeqPacket { fd })
    }

    /// A connected pair (tests).
    pub fn pair() -> io::Result<(SeqPacket, SeqPacket)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds has room for two.
        cvt(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        })?;
        // SAFETY: two fresh fds.
        Ok(unsafe {
            (
                SeqPacket {
                    fd: OwnedFd::from_raw_fd(fds[0]),
                },
                SeqPacket {
                    fd: OwnedFd::from_raw_fd(fds[1]),
                },
            )
        })
    }

    /// The socket's own fd, borrowed (tests that send it as a wrong-kind fd).
    #[doc(hidden)]
    pub fn as_fd_for_test(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }

    /// The raw fd (for poll).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The peer's pid, uid and gid.
    pub fn peer_cred(&self) -> io::Result<PeerCred> {
        // SAFETY: zero is a valid ucred; getsockopt fills at most `len` bytes.
        let mut c: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        cvt(unsafe {
            libc::getsockopt(
                self.raw(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                &mut c as *mut libc::ucred as *mut libc::c_void,
                &mut len,
            )
        })?;
        Ok(PeerCred {
            pid: c.pid as u32,
            uid: c.uid,
            gid: c.gid,
        })
    }

    /// Sends one message with `fds` attached.
    pub fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if data.len() > MAX_MESSAGE || fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message or fd list too long",
            ));
        }
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        // Control buffer for MAX_FDS fds, u64-aligned as cmsghdr needs.
        let mut cbuf = [0u64; 8];
        let mut m = msghdr(&mut iov);
        if !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds);
            // SAFETY: CMSG_SPACE of at most MAX_FDS ints fits cbuf (64 bytes); the header
            // pointer comes from CMSG_FIRSTHDR on that buffer.
            unsafe {
                m.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
                m.msg_controllen = libc::CMSG_SPACE(bytes as u32) as usize;
                let c = libc::CMSG_FIRSTHDR(&m);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
                let p = libc::CMSG_DATA(c) as *mut RawFd;
                for (i, f) in fds.iter().enumerate() {
                    p.add(i).write_unaligned(f.as_raw_fd());
                }
            }
        }
        // SAFETY: m points at live buffers; MSG_NOSIGNAL: a gone peer is an error, not
        // SIGPIPE.
        retry_eintr(|| unsafe { libc::sendmsg(self.raw(), &m, libc::MSG_NOSIGNAL) }).map(drop)
    }

    /// Receives one message into `buf`: its length (0: the peer closed) and the fds that
    /// came with it. A message longer than `buf`, an empty one, or one with more fds than
    /// [`MAX_FDS`] is an `InvalidData` error (its fds are closed) and the connection goes on.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; 8];
        let mut m = msghdr(&mut iov);
        m.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        m.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: m points at live buffers; fds arrive close-on-exec.
        let n =
            retry_eintr(|| unsafe { libc::recvmsg(self.raw(), &mut m, libc::MSG_CMSG_CLOEXEC) })?;
        let mut fds = Vec::new();
        // SAFETY: walking the control messages the kernel wrote into cbuf; each fd in an
        // SCM_RIGHTS message is ours now and is owned exactly once.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&m);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const RawFd;
                    let count =
                        ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&m, c);
            }
        }
        if m.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message longer than the protocol allows",
            ));
        }
        if m.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more file descriptors than the protocol allows",
            ));
        }
        if n == 0 && (!fds.is_empty() || !self.hung_up()) {
            // An empty message, not the end of the connection.
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty message"));
        }
        Ok((n, fds))
    }

    /// Whether the peer has closed its end (POLLRDHUP / POLLHUP without waiting).
    pub fn hung_up(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no wait.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Sends a JSON message.
    pub fn send_json<T: Serialize>(&self, v: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let bytes = serde_json::to_vec(v).map_err(io::Error::other)?;
        self.send(&bytes, fds)
    }
}

/// A listening `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Binds and listens at `path` (which must not exist).
    pub fn bind(path: &Path) -> io::Result<Listener> {
        let fd = socket_at(path, libc::bind)?;
        // SAFETY: a bound socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
        Ok(Listener { fd })
    }

    /// Accepts a connection, waiting at most `timeout`; `None` on timeout.
    pub fn accept(&self, timeout: Duration) -> io::Result<Option<SeqPacket>> {
        if !wait_readable(self.fd.as_raw_fd(), Some(timeout))? {
            return Ok(None);
        }
        // SAFETY: accept4 on our listening socket; the result is checked and owned.
        let r = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ECONNABORTED) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: a fresh fd.
        Ok(Some(SeqPacket {
            fd: unsafe { OwnedFd::from_raw_fd(r) },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn messages_and_fds_cross_a_pair() {
        let (a, b) = SeqPacket::pair().unwrap();
        let area = crate::abi::area::Area::new(4096, "t").unwrap();
        area.write_at(10, b"hello").unwrap();
        let fd = area.dup_fd().unwrap();
        a.send(b"{\"x\":1}", &[fd.as_fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"{\"x\":1}");
        assert_eq!(fds.len(), 1);
        let other = crate::abi::area::Area::from_fd(fds.into_iter().next().unwrap(), 4096).unwrap();
        let mut got = [0u8; 5];
        other.read_at(10, &mut got).unwrap();
        assert_eq!(&got, b"hello", "the same bytes on both mappings");
        // Too long for the buffer: an error, not a silently cut message.
        a.send(&[b'x'; 100], &[]).unwrap();
        assert!(b.recv(&mut buf).is_err());
        // More fds than allowed: refused by the sender; a closed peer reads as 0 bytes.
        let many: Vec<_> = (0..5).map(|_| fd.as_fd()).collect();
        assert!(a.send(b"x", &many).is_err());
        drop(a);
        assert_eq!(b.recv(&mut buf).unwrap().0, 0);
    }

    #[test]
    fn errors_round_trip_with_their_errno() {
        for e in [
            VerbsError::InvalidArgument("x".into()),
            VerbsError::NoResources("queue pairs (host.max_qps)"),
            VerbsError::NotFound("queue pair"),
            VerbsError::Busy("protection domain"),
            VerbsError::QueueFull,
            VerbsError::InvalidState(roce::verbs::QpState::Rtr),
            VerbsError::DeviceFatal,
        ] {
            let w = WireError::from(&e);
            let j = serde_json::to_string(&w).unwrap();
            let back: WireError = serde_json::from_str(&j).unwrap();
            assert_eq!(back.clone().into_verbs(), e, "{j}");
            assert!(back.errno() > 0);
        }
        assert_eq!(
            WireError::NotFound("spaceship".into()).into_verbs(),
            VerbsError::NotFound("object")
        );
    }

    #[test]
    fn requests_are_readable_json() {
        let r = Request {
            id: 7,
            body: Body::Call(Command::CreateCq {
                cqe: 16,
                capacity: 16,
            }),
        };
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(
            j,
            r#"{"id":7,"call":{"create_cq":{"cqe":16,"capacity":16}}}"#
        );
        let back: Request = serde_json::from_str(&j).unwrap();
        assert!(matches!(
            back.body,
            Body::Call(Command::CreateCq { cqe: 16, .. })
        ));
        // Out-of-range QPNs are masked to 24 bits, never stored as given.
        let q: Request =
            serde_json::from_str(r#"{"id":1,"call":{"query_qp":{"qpn":4294967295}}}"#).unwrap();
        match q.body {
            Body::Call(Command::QueryQp { qpn }) => assert_eq!(qpn.value(), 0xff_ffff),
            o => panic!("{o:?}"),
        }
        for bad in [
            "",
            "{",
            "[]",
            r#"{"id":1}"#,
            r#"{"id":1,"call":{"nope":{}}}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }
}
