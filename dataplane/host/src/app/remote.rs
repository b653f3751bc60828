//! The client side of rnicd's socket: [`connect`] attaches this process to an RNIC of a
//! running rnicd and returns a [`RemoteContext`], which implements [`crate::app::Verbs`] exactly as
//! an in-process context (`dataplane::Context`) does: posts and completions go through shared-memory
//! rings with no system call; control calls (create, modify, register...) are messages on the
//! socket. [`Admin`] is the management connection `rnic-ctl` uses.
//!
//! A thread per connection watches the socket: when rnicd goes away (stopped or killed) the
//! context turns device-fatal at once, so calls fail and `poll_event` reports
//! `AsyncEvent::DeviceFatal` instead of an application polling forever.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use roce::engine::{VerbsError, VerbsResult};

use crate::abi::area::Area;
use crate::abi::proto::{
    socket_path, AdminRequest, Body, Hello, Reply, ReplyBody, Request, Role, SeqPacket, Welcome,
    WireError, MAX_MESSAGE, VERSION,
};
use crate::abi::{Command, ReplyData};
use crate::app::{Channel, Client, ClientRings};

/// Why attaching to rnicd failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The socket could not be reached.
    #[error(
        "cannot reach rnicd at {0}: {1} (is rnicd running? `rnicd --loopback` starts one; \
         the socket is host.socket in its configuration, or set FERROCE_SOCKET)"
    )]
    Unreachable(PathBuf, std::io::Error),
    /// rnicd refused the hello.
    #[error("rnicd refused: {0}")]
    Refused(WireError),
    /// rnicd answered something this client does not understand.
    #[error("rnicd protocol error: {0}")]
    Protocol(String),
}

/// A connection's socket and request ids.
struct Conn {
    sock: SeqPacket,
    next_id: u64,
    buf: Vec<u8>,
}

impl Conn {
    fn open(path: &Path, hello: Hello) -> Result<(Conn, Welcome, Vec<OwnedFd>), ConnectError> {
        let sock =
            SeqPacket::connect(path).map_err(|e| ConnectError::Unreachable(path.into(), e))?;
        let mut c = Conn {
            sock,
            next_id: 1,
            buf: vec![0; MAX_MESSAGE],
        };
        let (body, fds) = c
            .request(Body::Hello(hello), &[], None)
            .map_err(|e| match e {
                WireError::Protocol(p) => ConnectError::Protocol(p),
                e => ConnectError::Refused(e),
            })?;
        match body {
            ReplyBody::Welcome(w) if w.version == VERSION => Ok((c, w, fds)),
            ReplyBody::Welcome(w) => Err(ConnectError::Protocol(format!(
                "rnicd speaks protocol version {}, this client {VERSION}",
                w.version
            ))),
            o => Err(ConnectError::Protocol(format!("unexpected answer {o:?}"))),
        }
    }

    /// Sends a request and waits for its reply (until `deadline`, if any). A closed socket
    /// is `DeviceFatal`.
    fn request(
        &mut self,
        body: Body,
        fds: &[BorrowedFd<'_>],
        deadline: Option<Instant>,
    ) -> Result<(ReplyBody, Vec<OwnedFd>), WireError> {
        let id = self.next_id;
        self.next_id += 1;
        self.sock
            .send_json(&Request { id, body }, fds)
            .map_err(|_| WireError::DeviceFatal)?;
        loop {
            let wait = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if wait.is_some_and(|w| w.is_zero()) {
                return Err(WireError::DeviceFatal);
            }
            match crate::abi::proto::wait_readable(self.sock.raw(), wait) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => return Err(WireError::DeviceFatal),
            }
            let (n, fds) = self
                .sock
                .recv(&mut self.buf)
                .map_err(|_| WireError::DeviceFatal)?;
            if n == 0 {
                return Err(WireError::DeviceFatal);
            }
            let r: Reply = serde_json::from_slice(&self.buf[..n])
                .map_err(|e| WireError::Protocol(format!("unreadable reply: {e}")))?;
            // A reply to a request given up on (call_until) is skipped; an error with id 0 is
            // rnicd refusing the connection or a message it could not read: ours.
            if r.id != id && !(r.id == 0 && r.status != 0) {
                continue;
            }
            return r.into_result().map(|b| (b, fds));
        }
    }
}

/// Control calls over rnicd's socket (the [`Channel`] of a [`RemoteContext`]).
pub struct SocketChannel {
    conn: Conn,
    alive: Arc<AtomicBool>,
    watcher: Option<(JoinHandle<()>, OwnedFd)>,
}

/// An application's handle on an RNIC of rnicd.
pub type RemoteContext = Client<SocketChannel>;

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh fds.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Blocks until the socket hangs up (rnicd gone) or `wake` is closed (the client dropped).
fn watch(sock: OwnedFd, wake: OwnedFd, alive: Arc<AtomicBool>) {
    loop {
        let mut p = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let r = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if p[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            alive.store(false, Ordering::Release);
            return;
        }
        if p[1].revents != 0 {
            return;
        }
    }
}

impl SocketChannel {
    fn new(conn: Conn) -> SocketChannel {
        let alive = Arc::new(AtomicBool::new(true));
        let watcher = (|| {
            let sock = conn.sock_fd().try_clone_to_owned().ok()?;
            let (r, w) = pipe().ok()?;
            let a = alive.clone();
            let h = std::thread::Builder::new()
                .name("ferroce-watch".into())
                .spawn(move || watch(sock, r, a))
                .ok()?;
            Some((h, w))
        })();
        SocketChannel {
            conn,
            alive,
            watcher,
        }
    }
}

impl Conn {
    fn sock_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the socket outlives the borrow (it is a field of self).
        unsafe { BorrowedFd::borrow_raw(self.sock.raw()) }
    }
}

impl Drop for SocketChannel {
    fn drop(&mut self) {
        if let Some((h, w)) = self.watcher.take() {
            drop(w); // the watcher's pipe reads end-of-file: it returns
            let _ = h.join();
        }
    }
}

impl Channel for SocketChannel {
    fn exchange(
        &mut self,
        cmd: Command,
        area: Option<Arc<Area>>,
        deadline: Option<Instant>,
    ) -> VerbsResult<ReplyData> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        // The area's own fd stays where it is (its creator decides when to close it).
        let dups = area
            .iter()
            .map(|a| a.dup_fd())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| {
                VerbsError::InvalidArgument(format!("the memory area cannot be sent: {e}"))
            })?;
        let fds: Vec<BorrowedFd<'_>> = dups.iter().map(|d| d.as_fd()).collect();
        let r = self.conn.request(Body::Call(cmd), &fds, deadline);
        match r {
            Ok((ReplyBody::Call(d), _)) => Ok(d),
            Ok((o, _)) => Err(VerbsError::InvalidArgument(format!(
                "rnicd: unexpected reply {o:?}"
            ))),
            Err(WireError::DeviceFatal) => {
                self.alive.store(false, Ordering::Release);
                Err(VerbsError::DeviceFatal)
            }
            Err(e) => Err(e.into_verbs()),
        }
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

fn program() -> String {
    std::env::args()
        .next()
        .map(|a| {
            Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or(a)
        })
        .unwrap_or_default()
}

/// Attaches to RNIC `device` (`ferroce0`...; `None`: the first) of the rnicd listening on
/// `socket` (`None`: `$FERROCE_SOCKET` or /run/ferroce/rnicd.sock).
pub fn connect(socket: Option<&Path>, device: Option<&str>) -> Result<RemoteContext, ConnectError> {
    let path = socket_path(socket);
    let hello = Hello {
        version: VERSION,
        device: device.map(String::from),
        role: Role::Verbs,
        program: program(),
    };
    let (conn, w, fds) = Conn::open(&path, hello)?;
    w.limits
        .check_sane()
        .map_err(|e| ConnectError::Protocol(e.to_string()))?;
    let [posts, events, index]: [OwnedFd; 3] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
        ConnectError::Protocol(format!("welcome carried {} fds, not 3", v.len()))
    })?;
    let map = |fd: OwnedFd, len: u64, what: &str| {
        Area::from_fd(fd, len as usize)
            .map(Arc::new)
            .map_err(|e| ConnectError::Protocol(format!("cannot map the {what}: {e}")))
    };
    let rings = ClientRings {
        posts: map(posts, w.ring_bytes[0], "post ring")?,
        events: map(events, w.ring_bytes[1], "event ring")?,
        index: map(index, w.ring_bytes[2], "index area")?,
    };
    let expect = [
        crate::abi::ring::ring_bytes::<crate::abi::slots::PostCell>(crate::abi::POST_RING),
        crate::abi::ring::ring_bytes::<crate::abi::slots::EventSlot>(crate::abi::EVENT_RING),
        w.limits.index_bytes(),
    ];
    if expect
        .iter()
        .zip(&w.ring_bytes)
        .any(|(e, g)| *e as u64 != *g)
    {
        return Err(ConnectError::Protocol(format!(
            "ring sizes {:?} differ from this client's {expect:?}",
            w.ring_bytes
        )));
    }
    Ok(Client::attach(SocketChannel::new(conn), rings, w.limits))
}

/// A management connection to rnicd (what `rnic-ctl` uses).
pub struct Admin {
    conn: Conn,
    /// What rnicd said in its welcome (its RNICs, its pid).
    pub welcome: Welcome,
}

impl Admin {
    /// Connects to the rnicd listening on `socket` (`None`: the default path).
    pub fn connect(socket: Option<&Path>) -> Result<Admin, ConnectError> {
        let path = socket_path(socket);
        let hello = Hello {
            version: VERSION,
            device: None,
            role: Role::Admin,
            program: program(),
        };
        let (conn, welcome, _) = Conn::open(&path, hello)?;
        Ok(Admin { conn, welcome })
    }

    /// Runs one admin request.
    pub fn request(&mut self, req: AdminRequest) -> Result<ReplyBody, WireError> {
        self.conn
            .request(Body::Admin(req), &[], None)
            .map(|(b, _)| b)
    }

    /// The raw socket (tests that speak the protocol by hand).
    pub fn socket(&self) -> &SeqPacket {
        &self.conn.sock
    }
}

impl AsFd for SocketChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.sock_fd()
    }
}
