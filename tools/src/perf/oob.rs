//! perftest's out-of-band TCP exchange, byte for byte (docs/perftest-protocol.md section 1),
//! and the rdma-core pingpong examples' exchange (section 7).
//!
//! perftest reads every item with one `read()` that must return the whole item, so each item is
//! sent with one `write()`; the client writes first and the server reads first (section 1.2).
//! With `-R` the same items travel as SENDs on an rdma_cm connection instead ([`Link`],
//! section 10), keys in their binary form ([`Key::encode_binary`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The version string we announce (perftest 4.5-0.17 says "6.06").
pub const VERSION: &str = "6.06";
/// Size of a RoCE key message (`KEY_MSG_SIZE_GID`).
pub const KEY_MSG_SIZE: usize = 108;
/// Size of an rdma-core pingpong address message.
pub const PP_MSG_SIZE: usize = 52;
/// The closing message.
pub const DONE: &[u8; 5] = b"done\0";

/// Which end of the exchange this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Started without an address: listens, reads first.
    Server,
    /// Started with the server's address: connects, writes first.
    Client,
}

/// One side's connection data as perftest exchanges it (`pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Key {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding READ/ATOMIC the sender accepts as responder.
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// Remote key of the advertised region.
    pub rkey: u32,
    /// Address of the advertised region.
    pub vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// SRQ number (0 unless XRC/DC).
    pub srqn: u32,
}

/// `text` in a NUL-padded message of N bytes, as perftest's `sprintf` into a fixed buffer
/// leaves it (the text is always shorter: the formats above have fixed widths).
fn nul_padded<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [0u8; N];
    out[..text.len()].copy_from_slice(text.as_bytes());
    out
}

/// The text before the first NUL of a message from the peer (all of it without one), or
/// None when it is not UTF-8.
fn c_text(msg: &[u8]) -> Option<&str> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    std::str::from_utf8(&msg[..end]).ok()
}

impl Key {
    /// The 108-byte message: `%04x:%04x:%06x:%06x:%08x:%016llx:` + 16 x `%02x:` + `%08x:` + NUL.
    pub fn encode(&self) -> [u8; KEY_MSG_SIZE] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        nul_padded(&s)
    }

    /// Parses a key message (validates every field: the peer is untrusted).
    pub fn decode(msg: &[u8]) -> Result<Key, String> {
        let text = c_text(msg).ok_or("key message is not ASCII")?;
        let f: Vec<&str> = text.split(':').collect();
        // 6 fields, 16 GID bytes, SRQN, and the empty piece after the last ':'.
        if f.len() < 23 {
            return Err(format!(
                "key message has {} fields, want 23: {text:?}",
                f.len()
            ));
        }
        let hex = |i: usize, max_digits: usize| -> Result<u64, String> {
            let s = f[i];
            if s.is_empty() || s.len() > max_digits {
                return Err(format!("key field {i} {s:?} is not {max_digits}-digit hex"));
            }
            u64::from_str_radix(s, 16).map_err(|_| format!("key field {i} {s:?} is not hex"))
        };
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = hex(6 + k, 2)? as u8;
        }
        Ok(Key {
            lid: hex(0, 4)? as u16,
            out_reads: hex(1, 4)? as u16,
            qpn: hex(2, 6)? as u32,
            psn: hex(3, 6)? as u32,
            rkey: hex(4, 8)? as u32,
            vaddr: hex(5, 16)?,
            gid,
            srqn: hex(22, 8)? as u32,
        })
    }
}

/// Size of a key as perftest SENDs it with `-R` (`struct pingpong_dest` on x86-64).
pub const KEY_BIN_SIZE: usize = 56;

impl Key {
    /// The key as perftest's `rdma_write_keys` SENDs it: `struct pingpong_dest` with every
    /// integer big-endian (`htobe32`/`htobe64`), the GID as is, padding zero; `gid_index` is
    /// the sender's GID index.
    pub fn encode_binary(&self, gid_index: u8) -> [u8; KEY_BIN_SIZE] {
        let mut b = [0u8; KEY_BIN_SIZE];
        b[0..4].copy_from_slice(&(self.lid as u32).to_be_bytes());
        b[4..8].copy_from_slice(&(self.out_reads as u32).to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&(gid_index as u32).to_be_bytes());
        b
    }

    /// Reads a binary key (`rdma_read_keys`). Every value is taken as sent; QPN and PSN are
    /// 24-bit on the wire, so their high bytes must be zero (the peer is untrusted).
    pub fn decode_binary(b: &[u8]) -> Result<Key, String> {
        if b.len() < KEY_BIN_SIZE {
            return Err(format!(
                "key message of {} bytes, want {KEY_BIN_SIZE}",
                b.len()
            ));
        }
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let (qpn, psn) = (u32_at(8), u32_at(12));
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(format!(
                "key with QPN {qpn:#x} / PSN {psn:#x}: more than 24 bits"
            ));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let mut va = [0u8; 8];
        va.copy_from_slice(&b[24..32]);
        Ok(Key {
            lid: u32_at(0) as u16,
            out_reads: u32_at(4).min(u16::MAX as u32) as u16,
            qpn,
            psn,
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(va),
            gid,
            srqn: u32_at(48),
        })
    }
}

/// A message channel that carries the exchange instead of TCP: each item is one message,
/// delivered whole and in order (perftest `-R`: SENDs on an RC QP of an rdma_cm connection).
pub trait Link {
    /// Sends `item` as one message and waits until it is delivered.
    fn send(&mut self, item: &[u8]) -> io::Result<()>;
    /// The next message's first `n` bytes (it must hold at least `n`), waiting up to
    /// `timeout` (None: until SIGINT/SIGTERM). A peer that went away is
    /// `UnexpectedEof`, "the peer closed the connection".
    fn recv(&mut self, n: usize, timeout: Option<Duration>) -> io::Result<Vec<u8>>;
    /// Whether a message is waiting, or the peer went away (without waiting).
    fn has_data(&mut self) -> bool;
    /// Ends the connection and releases what it holds.
    fn close(&mut self);
}

enum Transport {
    Tcp(TcpStream),
    Link(Box<dyn Link>),
}

/// A bandwidth report as exchanged after the test (section 1.5).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WireReport {
    /// Message size.
    pub size: u64,
    /// Iterations over all QPs.
    pub iters: u64,
    /// Peak bandwidth in the sender's unit.
    pub bw_peak: f64,
    /// Average bandwidth in the sender's unit.
    pub bw_avg: f64,
    /// Messages per second in millions.
    pub msg_rate: f64,
}

/// The connection to the peer tool: TCP, or a [`Link`] with `-R`.
pub struct Oob {
    t: Transport,
    role: Role,
    /// `set_read_timeout` for a link (TCP keeps its own).
    link_timeout: Option<Duration>,
}

impl Oob {
    /// Accepts exactly one connection on `listener` (perftest's `listen(fd, 1)`), then stops
    /// listening.
    pub fn accept(listener: TcpListener) -> io::Result<Oob> {
        // Polled, so that SIGINT/SIGTERM can end the wait for a client.
        listener.set_nonblocking(true)?;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if super::interrupted() {
                        return Err(io::Error::new(
                            io::ErrorKind::Interrupted,
                            super::INTERRUPTED,
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        };
        drop(listener);
        stream.set_nonblocking(false)?;
        Self::from_stream(stream, Role::Server)
    }

    /// Binds the server's listening socket on all addresses at `port` (IPv6 with `v6`,
    /// perftest's --ipv6).
    pub fn listen(port: u16, v6: bool) -> io::Result<TcpListener> {
        if v6 {
            TcpListener::bind(("::", port))
        } else {
            TcpListener::bind(("0.0.0.0", port))
        }
    }

    /// Connects to the server, retrying for up to `patience` while it is not listening yet
    /// (the two ends are often started together), and saying so on stderr once the first
    /// attempt failed; Ctrl-C (SIGINT/SIGTERM) stops the wait. The error is the last
    /// attempt's (the caller names the address).
    pub fn connect(host: &str, port: u16, patience: Duration) -> io::Result<Oob> {
        let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
        let deadline = Instant::now() + patience;
        let mut said = false;
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                    Ok(s) => return Self::from_stream(s, Role::Client),
                    Err(e) => last = Some(e),
                }
            }
            let err = last.unwrap_or_else(|| io::Error::other("no address"));
            if Instant::now() >= deadline || crate::rnic_opts::stop_requested() {
                return Err(err);
            }
            if !said {
                said = true;
                eprintln!(
                    "rnic-perf: no server at {host}:{port} yet ({err}); retrying for {} s \
                     (Ctrl-C to stop)",
                    patience.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn from_stream(stream: TcpStream, role: Role) -> io::Result<Oob> {
        // Items must leave as single segments promptly; the peer reads each one whole.
        stream.set_nodelay(true)?;
        Ok(Oob {
            t: Transport::Tcp(stream),
            role,
            link_timeout: None,
        })
    }

    /// The exchange over `link` (perftest `-R`), as `role`.
    pub fn from_link(link: Box<dyn Link>, role: Role) -> Oob {
        Oob {
            t: Transport::Link(link),
            role,
            link_timeout: None,
        }
    }

    /// Whether the exchange runs over a [`Link`] (`-R`).
    pub fn is_link(&self) -> bool {
        matches!(self.t, Transport::Link(_))
    }

    /// This side's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether the peer has sent something not read yet (without reading it or waiting).
    pub fn peer_has_data(&mut self) -> bool {
        let stream = match &mut self.t {
            Transport::Tcp(s) => s,
            Transport::Link(l) => return l.has_data(),
        };
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut b = [0u8; 1];
        let r = stream.peek(&mut b);
        let _ = stream.set_nonblocking(false);
        // Data waiting, or the connection closed (Ok(0)): either way the peer is done.
        r.is_ok()
    }

    /// Sets how long a read may wait (None: forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        match &self.t {
            Transport::Tcp(s) => s.set_read_timeout(t),
            Transport::Link(_) => {
                self.link_timeout = t;
                Ok(())
            }
        }
    }

    /// Sends `item` in one write (one message on a link).
    fn send(&mut self, item: &[u8]) -> io::Result<()> {
        match &mut self.t {
            Transport::Tcp(s) => s.write_all(item),
            Transport::Link(l) => l.send(item),
        }
    }

    fn recv(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let stream = match &mut self.t {
            Transport::Tcp(s) => s,
            Transport::Link(l) => return l.recv(n, self.link_timeout),
        };
        let mut buf = vec![0u8; n];
        let mut got = 0;
        // Reads wake up now and then to notice SIGINT/SIGTERM; a read timeout set by the
        // caller (`set_read_timeout`) still applies to the whole item.
        let user_timeout = stream.read_timeout()?;
        let started = Instant::now();
        stream.set_read_timeout(Some(Duration::from_millis(200)))?;
        let r = loop {
            if got == n {
                break Ok(());
            }
            match stream.read(&mut buf[got..]) {
                Ok(0) => {
                    break Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection",
                    ))
                }
                Ok(k) => got += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    if super::interrupted() {
                        break Err(io::Error::new(
                            io::ErrorKind::Interrupted,
                            super::INTERRUPTED,
                        ));
                    }
                    if user_timeout.is_some_and(|t| started.elapsed() >= t) {
                        break Err(io::Error::new(io::ErrorKind::TimedOut, e.to_string()));
                    }
                }
                Err(e) => break Err(e),
            }
        };
        stream.set_read_timeout(user_timeout)?;
        r.map(|_| buf)
    }

    /// One lock-step exchange of equal-sized items: the client writes then reads, the server
    /// reads then writes.
    pub fn xchg(&mut self, mine: &[u8]) -> io::Result<Vec<u8>> {
        match self.role {
            Role::Client => {
                self.send(mine)?;
                self.recv(mine.len())
            }
            Role::Server => {
                let theirs = self.recv(mine.len())?;
                self.send(mine)?;
                Ok(theirs)
            }
        }
    }

    /// The negotiation items (section 1.3): version, cycle buffer, cache line, MTU. Returns the
    /// peer's version, the agreed cycle buffer and cache line, and the agreed `ibv_mtu` value.
    pub fn negotiate(
        &mut self,
        cycle_buffer: u32,
        cache_line: u32,
        mtu: u32,
    ) -> Result<(String, u32, u32, u32), String> {
        let v: [u8; 16] = nul_padded(VERSION);
        let rv = self
            .xchg(&v)
            .map_err(|e| format!("version exchange: {e}"))?;
        let rem_version = c_text(&rv)
            .ok_or("peer sent a version that is not text")?
            .to_owned();
        let num: f64 = rem_version
            .trim()
            .parse()
            .map_err(|_| format!("peer sent an unreadable version {rem_version:?}"))?;
        // Older perftests skip or resize these items (section 1.3); we speak 5.32 and later.
        if num < 5.32 {
            return Err(format!(
                "peer perftest version {rem_version} is older than 5.32, which rnic-perf does not speak"
            ));
        }
        let cb = self
            .xchg(&cycle_buffer.to_be_bytes())
            .map_err(|e| format!("cycle buffer exchange: {e}"))?;
        let cl = self
            .xchg(&cache_line.to_be_bytes())
            .map_err(|e| format!("cache line exchange: {e}"))?;
        let rcb = u32::from_be_bytes([cb[0], cb[1], cb[2], cb[3]]);
        let rcl = u32::from_be_bytes([cl[0], cl[1], cl[2], cl[3]]);
        // An absurd value from the peer would make us allocate without bound.
        if !(rcb.is_power_of_two() && rcb <= 1 << 21 && rcl.is_power_of_two() && rcl <= 4096) {
            return Err(format!(
                "peer sent cycle buffer {rcb} / cache line {rcl}: not plausible"
            ));
        }
        let m = [b'0' + (mtu as u8 % 10), 0];
        let rm = self.xchg(&m).map_err(|e| format!("MTU exchange: {e}"))?;
        let rmtu = (rm[0] as char).to_digit(10).unwrap_or(0);
        let agreed = if (1..=5).contains(&rmtu) && rmtu < mtu {
            rmtu
        } else {
            mtu
        };
        Ok((
            rem_version,
            cycle_buffer.max(rcb),
            cache_line.max(rcl),
            agreed,
        ))
    }

    /// One key round (`gid_index`: ours, which the binary form carries).
    pub fn keys(&mut self, mine: &Key, gid_index: u8) -> Result<Key, String> {
        if self.is_link() {
            let theirs = self
                .xchg(&mine.encode_binary(gid_index))
                .map_err(|e| format!("Couldn't read remote address: {e}"))?;
            return Key::decode_binary(&theirs);
        }
        let theirs = self
            .xchg(&mine.encode())
            .map_err(|e| format!("Couldn't read remote address: {e}"))?;
        Key::decode(&theirs)
    }

    /// The closing key round over a link. Each side ends the link once the round is over
    /// for it, and a lost ACK lets that disconnection overtake the other side's last send:
    /// the server's answer when the client has it (the client ends the link), the client's
    /// keys when the server has answered them (the server ends it). Both were seen in the
    /// real soak over a lossy link (4 rdma_cm runs in 20 minutes). So a send ended by the
    /// peer's disconnection does not fail the round: the server already has the client's
    /// keys, and the client still reads the answer, which arrived before the disconnection
    /// if the server sent it.
    fn closing_keys_link(&mut self, mine: &Key, gid_index: u8) -> Result<(), String> {
        let item = mine.encode_binary(gid_index);
        let send = |o: &mut Self| match o.send(&item) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(()),
            Err(e) => Err(format!("Couldn't send the closing address: {e}")),
        };
        let read = |o: &mut Self| -> Result<(), String> {
            let theirs = o
                .recv(item.len())
                .map_err(|e| format!("Couldn't read remote address: {e}"))?;
            Key::decode_binary(&theirs).map(|_| ())
        };
        match self.role {
            Role::Server => {
                read(self)?;
                send(self)
            }
            Role::Client => {
                send(self)?;
                read(self)
            }
        }
    }

    /// The report exchange (section 1.5): five 8-byte items.
    pub fn reports(&mut self, mine: &WireReport) -> Result<WireReport, String> {
        let mut x = |b: [u8; 8]| -> Result<[u8; 8], String> {
            let v = self
                .xchg(&b)
                .map_err(|e| format!("Couldn't read reports: {e}"))?;
            let mut a = [0u8; 8];
            a.copy_from_slice(&v);
            Ok(a)
        };
        let size = u64::from_be_bytes(x(mine.size.to_be_bytes())?);
        let iters = u64::from_be_bytes(x(mine.iters.to_be_bytes())?);
        let bw_peak = f64::from_be_bytes(x(mine.bw_peak.to_be_bytes())?);
        let bw_avg = f64::from_be_bytes(x(mine.bw_avg.to_be_bytes())?);
        let msg_rate = f64::from_be_bytes(x(mine.msg_rate.to_be_bytes())?);
        Ok(WireReport {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate,
        })
    }

    /// `ctx_close_connection`: one key round, then "done" without waiting for the peer's
    /// (over a link only the key round; the link is then closed). `then` runs after the
    /// round, before the connection ends.
    pub fn close(mut self, mine: &Key, gid_index: u8, then: impl FnOnce()) -> Result<(), String> {
        if self.is_link() {
            self.closing_keys_link(mine, gid_index)?;
        } else {
            self.keys(mine, gid_index)?;
        }
        then();
        match &mut self.t {
            Transport::Link(l) => {
                l.close();
                Ok(())
            }
            Transport::Tcp(stream) => {
                stream.write_all(DONE).map_err(|e| format!("done: {e}"))?;
                // Take the peer's "done" (or EOF) if it comes promptly, so it is not reset on
                // close.
                let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                let mut b = [0u8; 5];
                let _ = stream.read(&mut b);
                Ok(())
            }
        }
    }

    /// The rdma-core pingpong exchange (section 7.1). `connect` runs on the server between
    /// reading the client's address and answering (it brings its QP up first, as rdma-core
    /// does).
    pub fn pingpong(
        &mut self,
        mine: &PpDest,
        connect: impl FnOnce(&PpDest) -> Result<(), String>,
    ) -> Result<PpDest, String> {
        let msg = mine.encode();
        match self.role {
            Role::Client => {
                self.send(&msg).map_err(|e| format!("send address: {e}"))?;
                let r = self
                    .recv(PP_MSG_SIZE)
                    .map_err(|e| format!("Couldn't read remote address: {e}"))?;
                let peer = PpDest::decode(&r)?;
                self.send(DONE).map_err(|e| format!("done: {e}"))?;
                connect(&peer)?;
                Ok(peer)
            }
            Role::Server => {
                let r = self
                    .recv(PP_MSG_SIZE)
                    .map_err(|e| format!("Couldn't read remote address: {e}"))?;
                let peer = PpDest::decode(&r)?;
                connect(&peer)?;
                self.send(&msg).map_err(|e| format!("send address: {e}"))?;
                let d = self.recv(DONE.len()).map_err(|e| format!("done: {e}"))?;
                if d != DONE {
                    return Err(format!("expected \"done\", got {d:?}"));
                }
                Ok(peer)
            }
        }
    }
}

/// An rdma-core pingpong address: `%04x:%06x:%06x:%s` with the GID as 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PpDest {
    /// LID.
    pub lid: u16,
    /// QPN.
    pub qpn: u32,
    /// PSN.
    pub psn: u32,
    /// GID (all zero without `-g`).
    pub gid: [u8; 16],
}

impl PpDest {
    /// The 52-byte message. The GID goes as four `%08x` of `htonl(word)`, which is its 16 bytes
    /// in order.
    pub fn encode(&self) -> [u8; PP_MSG_SIZE] {
        let mut s = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}"));
        }
        nul_padded(&s)
    }

    /// Parses the peer's message.
    pub fn decode(msg: &[u8]) -> Result<PpDest, String> {
        let text = c_text(msg).ok_or("address message is not ASCII")?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() != 4 || f[3].len() != 32 {
            return Err(format!("malformed pingpong address {text:?}"));
        }
        let num = |s: &str| u32::from_str_radix(s, 16).map_err(|_| format!("bad hex {s:?}"));
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(&f[3][2 * k..2 * k + 2], 16)
                .map_err(|_| format!("bad GID {:?}", f[3]))?;
        }
        Ok(PpDest {
            lid: num(f[0])? as u16,
            qpn: num(f[1])? & 0xff_ffff,
            psn: num(f[2])? & 0xff_ffff,
            gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No server: the error is the connection's own (the caller names the address once),
    /// after `patience`.
    #[test]
    fn connect_without_a_server_fails_after_its_patience() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = Instant::now();
        let Err(e) = Oob::connect("127.0.0.1", port, Duration::from_millis(300)) else {
            panic!("connected to nobody")
        };
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert!(!e.to_string().contains("connect to"), "{e}");
    }

    #[test]
    fn key_message_matches_the_capture() {
        // write_bw_4k frame 14 (docs/perftest-protocol.md 1.4).
        let want = b"0000:0001:000024:a3a3a9:000006ac:0000558787567000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:\0";
        assert_eq!(want.len(), KEY_MSG_SIZE);
        let k = Key::decode(want).unwrap();
        assert_eq!(k.qpn, 0x24);
        assert_eq!(k.psn, 0xa3a3a9);
        assert_eq!(k.rkey, 0x6ac);
        assert_eq!(k.vaddr, 0x558787567000);
        assert_eq!(k.out_reads, 1);
        assert_eq!(&k.gid[10..], &[0xff, 0xff, 10, 99, 0, 2]);
        assert_eq!(&k.encode()[..], &want[..]);
    }

    #[test]
    fn malformed_keys_are_errors() {
        for bad in [
            &b"garbage"[..],
            b"",
            b"0000:0001:zz0024:a3a3a9:000006ac:0000558787567000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:\0",
            b"0000:0001:000024:a3a3a9:000006ac:0000558787567000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:0:\0",
            b"0000:0001:000024:a3a3a9:000006ac:00005587875670001:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:\0",
            &[0xff; 108],
        ] {
            assert!(Key::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pingpong_message_matches_the_capture() {
        let want = b"0000:000011:2bb486:00000000000000000000ffff0a630002\0";
        assert_eq!(want.len(), PP_MSG_SIZE);
        let d = PpDest::decode(want).unwrap();
        assert_eq!(d.qpn, 0x11);
        assert_eq!(d.psn, 0x2bb486);
        assert_eq!(&d.gid[12..], &[10, 99, 0, 2]);
        assert_eq!(&d.encode()[..], &want[..]);
        assert!(PpDest::decode(b"0000:000011:2bb486:00\0").is_err());
        assert!(PpDest::decode(b"0000:0000zz:2bb486:00000000000000000000ffff0a630002\0").is_err());
    }

    /// A key naming only QP `qpn` (what the exchange tests send).
    fn key_of_qp(qpn: u32) -> Key {
        Key {
            qpn,
            ..Default::default()
        }
    }

    #[test]
    fn lockstep_exchange_over_tcp() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let srv = std::thread::spawn(move || {
            let mut o = Oob::accept(l).unwrap();
            let n = o.negotiate(4096, 64, 5).unwrap();
            let k = o.keys(&key_of_qp(0x12), 1).unwrap();
            let r = o
                .reports(&WireReport {
                    size: 1,
                    ..Default::default()
                })
                .unwrap();
            o.close(&Key::default(), 1, || {}).unwrap();
            (n, k, r)
        });
        let mut c = Oob::connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
        let n = c.negotiate(8192, 64, 3).unwrap();
        assert_eq!(n, ("6.06".to_string(), 8192, 64, 3));
        let k = c.keys(&key_of_qp(0x11), 1).unwrap();
        assert_eq!(k.qpn, 0x12);
        let rep = WireReport {
            size: 65536,
            iters: 20,
            bw_peak: 15.63,
            bw_avg: 15.625,
            msg_rate: 0.00025,
        };
        c.reports(&rep).unwrap();
        c.close(&Key::default(), 1, || {}).unwrap();
        let (sn, sk, sr) = srv.join().unwrap();
        // The server agrees on the smaller MTU and the larger cycle buffer.
        assert_eq!(sn, ("6.06".to_string(), 8192, 64, 3));
        assert_eq!(sk.qpn, 0x11);
        assert_eq!(sr, rep);
    }

    #[test]
    fn report_doubles_are_big_endian() {
        // write_bw_4k: bw_peak 12.816... travels as 40 29 a1 ea a9 89 7a b2.
        let v = f64::from_be_bytes([0x40, 0x29, 0xa1, 0xea, 0xa9, 0x89, 0x7a, 0xb2]);
        assert!((v - 12.816).abs() < 0.001, "{v}");
    }

    /// Messages between two threads, as a [`Link`] sees them.
    struct ChanLink {
        tx: std::sync::mpsc::Sender<Vec<u8>>,
        rx: std::sync::mpsc::Receiver<Vec<u8>>,
    }

    impl Link for ChanLink {
        fn send(&mut self, item: &[u8]) -> io::Result<()> {
            self.tx.send(item.to_vec()).map_err(io::Error::other)
        }
        fn recv(&mut self, n: usize, _t: Option<Duration>) -> io::Result<Vec<u8>> {
            let m = self.rx.recv().map_err(io::Error::other)?;
            assert!(m.len() >= n);
            Ok(m[..n].to_vec())
        }
        fn has_data(&mut self) -> bool {
            false
        }
        fn close(&mut self) {}
    }

    #[test]
    fn exchange_over_a_link_sends_binary_keys_and_no_done() {
        let (t1, r1) = std::sync::mpsc::channel();
        let (t2, r2) = std::sync::mpsc::channel();
        let srv = std::thread::spawn(move || {
            let link = ChanLink { tx: t2, rx: r1 };
            let mut o = Oob::from_link(Box::new(link), Role::Server);
            let n = o.negotiate(4096, 64, 5).unwrap();
            let k = o.keys(&key_of_qp(0x12), 3).unwrap();
            o.close(&Key::default(), 3, || {}).unwrap();
            (n, k)
        });
        let link = ChanLink { tx: t1, rx: r2 };
        let mut c = Oob::from_link(Box::new(link), Role::Client);
        assert_eq!(c.negotiate(8192, 64, 3).unwrap().3, 3);
        let mine = Key {
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_0000_1000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 99, 0, 2],
            out_reads: 16,
            ..Default::default()
        };
        assert_eq!(c.keys(&mine, 1).unwrap().qpn, 0x12);
        c.close(&Key::default(), 1, || {}).unwrap();
        let (sn, sk) = srv.join().unwrap();
        assert_eq!(sn.3, 3);
        assert_eq!(sk, mine);
        let bin = mine.encode_binary(1);
        assert_eq!(&bin[8..12], &[0, 0, 0, 0x11]);
        assert_eq!(&bin[24..32], &[0, 0, 0x7f, 0, 0, 0, 0x10, 0]);
        assert_eq!(&bin[52..56], &[0, 0, 0, 1]);
        assert_eq!(Key::decode_binary(&bin).unwrap(), mine);
        let mut bad = bin;
        bad[8] = 1; // a QPN over 24 bits
        assert!(Key::decode_binary(&bad).is_err());
        assert!(Key::decode_binary(&bin[..40]).is_err());
    }

    /// A link whose peer has the closing answer and ends the link before its ACK comes
    /// back: the answer's send ends with "the peer closed the connection".
    struct AnsweredThenGone {
        incoming: Vec<Vec<u8>>,
        sent: usize,
    }

    impl Drop for AnsweredThenGone {
        fn drop(&mut self) {
            // Each close sends its keys once, whatever came of it.
            assert!(self.sent <= 1);
        }
    }

    impl Link for AnsweredThenGone {
        fn send(&mut self, _item: &[u8]) -> io::Result<()> {
            self.sent += 1;
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ))
        }
        fn recv(&mut self, n: usize, _t: Option<Duration>) -> io::Result<Vec<u8>> {
            match self.incoming.pop() {
                Some(m) => Ok(m[..n].to_vec()),
                None => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                )),
            }
        }
        fn has_data(&mut self) -> bool {
            false
        }
        fn close(&mut self) {}
    }

    #[test]
    fn a_link_ended_after_the_closing_answer_closes_the_round() {
        let close = |role, incoming: Vec<Vec<u8>>| {
            let link = AnsweredThenGone { incoming, sent: 0 };
            Oob::from_link(Box::new(link), role).close(&Key::default(), 1, || {})
        };
        let key = || vec![Key::default().encode_binary(1).to_vec()];
        // The server has the client's keys; its answer's send ends with the link.
        assert_eq!(close(Role::Server, key()), Ok(()));
        // The client's keys' send ends with the link, but the answer is there.
        assert_eq!(close(Role::Client, key()), Ok(()));
        // A peer gone without its closing keys is still an error, on either side.
        assert!(close(Role::Server, Vec::new()).is_err());
        assert!(close(Role::Client, Vec::new()).is_err());
    }
}
