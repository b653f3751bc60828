//! rnicd's host interface in one process: a `Daemon` over a loopback pair of RNICs and
//! clients attached through its Unix socket (the same code paths as separate processes; the
//! tools' tests run real processes). Covers traffic through remote contexts, the hello's
//! errors, a hostile client next to a victim's verified traffic, a client scribbling on its
//! post ring while the worker reads it, per-client limits, reclaim
//! of a vanished client, and rnicd stopping under its clients.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::config::HostConfig;
use dataplane::daemon::Daemon;
use dataplane::runtime::{test_config, Runtime};
use dataplane::Verbs;
use ferroce_host::abi::area::Area;
use ferroce_host::abi::proto::{
    AdminRequest, Body, Hello, Reply, ReplyBody, Request, Role, SeqPacket, WireError, VERSION,
};
use ferroce_host::abi::slots::{post_kind, PostCells};
use ferroce_host::app::remote::{connect, Admin, ConnectError, RemoteContext};
use ferroce_tests::{connect_pair, post_recv_one, post_signaled, side, wait_cq, wait_until, Side};
use roce::engine::VerbsError;
use roce::verbs::*;

fn host_config(name: &str) -> HostConfig {
    let dir = ferroce_tests::process_temp_dir("daemon");
    HostConfig {
        socket: dir.join(format!("{name}.sock")),
        group: None,
        mode: 0o660,
        max_clients: 64,
        max_qps: None,
        max_cqs: None,
        max_mrs: None,
        max_pds: None,
        max_srqs: None,
        max_area_bytes: 1 << 30,
        max_areas: 1024,
        max_queue_bytes: 256 << 20,
    }
}

fn daemon(cfg: &HostConfig, a: u8, b: u8) -> Daemon {
    let rt = Runtime::loopback("ferroce-daemon", test_config(a, 4096), test_config(b, 4096))
        .expect("loopback");
    Daemon::start(rt, cfg).expect("daemon")
}

/// rnicd at a fresh socket named after `name`, on a loopback pair of RNICs with MAC bytes
/// `a` and `b`; with its default limits, and the objects RNIC 0 holds before any client
/// (what `assert_reclaimed` expects back).
fn started(name: &str, a: u8, b: u8) -> (HostConfig, Daemon, roce::engine::ObjectCounts) {
    let cfg = host_config(name);
    let d = daemon(&cfg, a, b);
    let idle = d.runtime().stats(0).objects;
    (cfg, d, idle)
}

fn remote(sock: &Path, dev: &str) -> RemoteContext {
    connect(Some(sock), Some(dev)).expect("connect")
}

/// An RC pair of remote contexts, connected.
fn rc_pair(sock: &Path) -> (Side<RemoteContext>, Side<RemoteContext>) {
    let mut a = side(remote(sock, "ferroce0"), QpType::Rc, 1 << 20, 64);
    let mut b = side(remote(sock, "ferroce1"), QpType::Rc, 1 << 20, 64);
    connect_pair(&mut a, &mut b, Mtu::M4096, (100, 200), QpType::Rc);
    (a, b)
}

/// WRITEs `len` bytes of a pattern seeded by `seed` from `a` to `b` and checks them there.
fn verified_write(a: &mut Side<RemoteContext>, b: &Side<RemoteContext>, seed: u8, len: usize) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    a.buf.write(0, &data);
    let wr = SendWr {
        wr_id: seed as u64,
        op: WrOp::Write {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey.unwrap(),
        },
        sg_list: &[a.mr.sge(0, len as u32)],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    a.ctx.post_send(a.qpn, &wr).expect("post");
    let c = wait_cq(a, 1, 10);
    assert_eq!(c.len(), 1, "completion of write {seed}");
    assert_eq!(c[0].status, WcStatus::Success, "{:?}", c[0]);
    assert_eq!(b.buf.to_vec(0, len), data, "bytes of write {seed}");
}

#[test]
fn remote_clients_move_verified_traffic_and_show_up_in_resources() {
    let (cfg, d, _) = started("traffic", 11, 12);
    let (mut a, mut b) = rc_pair(&cfg.socket);
    for seed in 0..20u8 {
        verified_write(&mut a, &b, seed, 1 + seed as usize * 3001);
    }
    // SEND with a receive on the other side; READ back.
    post_recv_one(&mut b, 9, 4096, 4096);
    a.buf.write(8192, b"through rnicd");
    post_signaled(&mut a, 1, WrOp::Send, 8192, 13);
    let rc = wait_cq(&mut b, 1, 10);
    assert_eq!(rc[0].status, WcStatus::Success);
    assert_eq!(rc[0].byte_len, 13);
    assert_eq!(b.buf.to_vec(4096, 13), b"through rnicd");
    assert_eq!(wait_cq(&mut a, 1, 10)[0].status, WcStatus::Success);
    post_signaled(
        &mut a,
        2,
        WrOp::Read {
            remote_addr: b.mr.addr + 4096,
            rkey: b.mr.rkey.unwrap(),
        },
        65536,
        13,
    );
    assert_eq!(wait_cq(&mut a, 1, 10)[0].status, WcStatus::Success);
    assert_eq!(a.buf.to_vec(65536, 13), b"through rnicd");
    // rnicd lists both clients with this process as owner, and their QPs in RTS.
    let mut adm = Admin::connect(Some(&cfg.socket)).unwrap();
    assert_eq!(adm.welcome.devices, ["ferroce0", "ferroce1"]);
    let Ok(ReplyBody::Resources(r)) = adm.request(AdminRequest::Resources) else {
        panic!("resources")
    };
    assert_eq!(r.clients.len(), 2, "{r:?}");
    assert!(r.clients.iter().all(|c| c.pid == std::process::id()));
    // SAFETY: geteuid has no preconditions.
    assert!(r
        .clients
        .iter()
        .all(|c| c.uid == unsafe { libc::geteuid() }));
    assert!(r.clients.iter().all(|c| c.area_bytes >= 1 << 20));
    assert_eq!(r.qps.len(), 2);
    assert!(r.qps.iter().all(|q| q.state == QpState::Rts));
    assert!(r
        .objects
        .iter()
        .filter(|o| o.kind == "mr")
        .all(|o| o.size == 1 << 20));
    drop((a, b));
    // Closing a context releases everything it held.
    let mut held = None;
    let released = wait_until(5, || {
        let Ok(ReplyBody::Resources(r)) = adm.request(AdminRequest::Resources) else {
            panic!()
        };
        let empty = r.clients.is_empty() && r.qps.is_empty() && r.objects.is_empty();
        held = Some(r);
        empty
    });
    assert!(released, "still held: {held:?}");
    d.stop();
    assert!(!cfg.socket.exists(), "the socket is removed at exit");
}

/// Speaks the protocol by hand: sends `body` as request `id` with `fds`, returns the reply
/// and the fds that came with it.
fn raw(
    sock: &SeqPacket,
    id: u64,
    body: Body,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> (Reply, Vec<OwnedFd>) {
    sock.send_json(&Request { id, body }, fds).unwrap();
    raw_reply(sock)
}

fn raw_reply(sock: &SeqPacket) -> (Reply, Vec<OwnedFd>) {
    let mut buf = vec![0u8; 65536];
    assert!(
        ferroce_host::abi::proto::wait_readable(sock.raw(), Some(Duration::from_secs(10))).unwrap()
    );
    let (n, fds) = sock.recv(&mut buf).unwrap();
    assert!(n > 0, "rnicd closed the connection");
    (serde_json::from_slice(&buf[..n]).unwrap(), fds)
}

fn hello(dev: &str) -> Body {
    Body::Hello(Hello {
        version: VERSION,
        device: Some(dev.into()),
        role: Role::Verbs,
        program: "hostile".into(),
    })
}

#[test]
fn hello_errors_are_clear() {
    let (cfg, d, _) = started("hello", 13, 14);
    match connect(Some(&cfg.socket), Some("mlx5_0")) {
        Err(ConnectError::Refused(WireError::NotFound(m))) => {
            assert!(m.contains("ferroce0, ferroce1"), "{m}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("an unknown device was accepted"),
    }
    let missing = cfg.socket.with_extension("nope");
    let e = connect(Some(&missing), None)
        .err()
        .expect("no daemon there");
    assert!(e.to_string().contains("is rnicd running?"), "{e}");
    // Another version: refused with EPROTONOSUPPORT.
    let s = SeqPacket::connect(&cfg.socket).unwrap();
    let (r, _) = raw(
        &s,
        1,
        Body::Hello(Hello {
            version: 99,
            device: None,
            role: Role::Verbs,
            program: String::new(),
        }),
        &[],
    );
    assert_eq!(r.status, libc::EPROTONOSUPPORT);
    // A call before the hello, and garbage: errors, then the connection is closed.
    let s = SeqPacket::connect(&cfg.socket).unwrap();
    let (r, _) = raw(&s, 5, Body::Admin(AdminRequest::Devices), &[]);
    assert_eq!((r.id, r.status), (5, libc::EPROTO));
    let s = SeqPacket::connect(&cfg.socket).unwrap();
    s.send(b"\xff\x00 not json", &[]).unwrap();
    let (r, _) = raw_reply(&s);
    assert_eq!(r.status, libc::EPROTO);
    // An empty message after the hello is an error, not the end of the connection.
    let s = SeqPacket::connect(&cfg.socket).unwrap();
    assert_eq!(raw(&s, 1, hello("ferroce0"), &[]).0.status, 0);
    s.send(b"", &[]).unwrap();
    assert_eq!(raw_reply(&s).0.status, libc::EPROTO);
    let (r, _) = raw(
        &s,
        2,
        Body::Call(ferroce_host::abi::Command::QueryPort),
        &[],
    );
    assert_eq!(r.status, 0, "{r:?}");
    // fds with an admin request: refused, the connection goes on.
    let (r, _) = raw(
        &s,
        3,
        Body::Admin(AdminRequest::Devices),
        &[s.as_fd_for_test()],
    );
    assert_eq!(r.status, libc::EPROTO, "{r:?}");
    // rnicd is fine: a normal client still works.
    let mut c = remote(&cfg.socket, "ferroce1");
    assert!(c.query_port().unwrap().active);
    drop(c);
    d.stop();
}

#[test]
fn a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced() {
    let (cfg, d, _) = started("takeover", 15, 16);
    let rt2 = Runtime::loopback(
        "ferroce-daemon",
        test_config(17, 1024),
        test_config(18, 1024),
    )
    .unwrap();
    match Daemon::start(rt2, &cfg) {
        Err(dataplane::daemon::DaemonError::InUse(_)) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second rnicd took over a live socket"),
    }
    d.stop();
    // A socket file nobody listens on (an rnicd that was killed) is replaced.
    drop(ferroce_host::abi::proto::Listener::bind(&cfg.socket).unwrap());
    assert!(cfg.socket.exists());
    let d = daemon(&cfg, 15, 16);
    assert!(remote(&cfg.socket, "ferroce0").query_port().is_ok());
    d.stop();
    // A path that is not a socket is left alone.
    std::fs::write(&cfg.socket, b"not a socket").unwrap();
    let rt3 = Runtime::loopback(
        "ferroce-daemon",
        test_config(15, 1024),
        test_config(16, 1024),
    )
    .unwrap();
    assert!(matches!(
        Daemon::start(rt3, &cfg),
        Err(dataplane::daemon::DaemonError::NotASocket(_))
    ));
    std::fs::remove_file(&cfg.socket).unwrap();
}

fn memfd(len: usize, seal: bool) -> OwnedFd {
    let fd = Area::memfd(len, "hostile").unwrap();
    if seal {
        // SAFETY: our fd; known seal flags.
        assert_eq!(
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
            0
        );
    }
    fd
}

#[test]
fn a_hostile_client_harms_neither_rnicd_nor_another_client() {
    let (cfg, d, _) = started("hostile", 19, 20);
    let (mut a, b) = rc_pair(&cfg.socket);
    let victim_qpn = b.qpn;
    // The victim's verified traffic runs throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let victim = std::thread::spawn(move || {
        let mut seed = 0u8;
        let mut n = 0u32;
        while !st.load(Ordering::Relaxed) || n < 20 {
            verified_write(&mut a, &b, seed, 4096 + seed as usize * 17);
            seed = seed.wrapping_add(1);
            n += 1;
        }
        n
    });
    let mut rng = roce::sim::Rng::new(42);
    // 1. Random bytes as messages, before and after a hello.
    for round in 0..2 {
        let s = SeqPacket::connect(&cfg.socket).unwrap();
        if round == 1 {
            assert_eq!(raw(&s, 1, hello("ferroce1"), &[]).0.status, 0);
        }
        for _ in 0..200 {
            let len = 1 + rng.below(2000) as usize;
            let junk: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if s.send(&junk, &[]).is_err() {
                break;
            }
            if ferroce_host::abi::proto::wait_readable(s.raw(), Some(Duration::from_secs(5)))
                .unwrap()
            {
                let mut buf = vec![0u8; 65536];
                if s.recv(&mut buf).map(|x| x.0).unwrap_or(0) == 0 {
                    break; // closed (before the hello, garbage ends the connection)
                }
            }
        }
    }
    // 2. A verbs client that breaks every rule of the calls.
    let s = SeqPacket::connect(&cfg.socket).unwrap();
    let (w, ring_fds) = raw(&s, 1, hello("ferroce1"), &[]);
    assert_eq!(w.status, 0);
    let mut id = 2;
    let mut call = |body: serde_json::Value, fds: &[std::os::fd::BorrowedFd<'_>]| {
        id += 1;
        let body: Body = serde_json::from_value(body).unwrap();
        raw(&s, id, body, fds).0
    };
    // Handles of another client: not found (the victim's QP is on ferroce1 too).
    for cmd in [
        serde_json::json!({"call": {"query_qp": {"qpn": victim_qpn.value()}}}),
        serde_json::json!({"call": {"destroy_qp": {"qpn": victim_qpn.value()}}}),
        serde_json::json!({"call": {"modify_qp": {"qpn": victim_qpn.value(), "attr": {
            "state": "Err", "cur_state": null, "path_mtu": null, "qkey": null, "rq_psn": null,
            "sq_psn": null, "dest_qp": null, "access": null, "av": null, "pkey_index": null,
            "port": null, "max_rd_atomic": null, "max_dest_rd_atomic": null,
            "min_rnr_timer": null, "timeout": null, "retry_cnt": null, "rnr_retry": null,
            "en_sqd_async_notify": null}}}}),
        serde_json::json!({"call": {"dealloc_pd": {"pd": 1}}}),
        serde_json::json!({"call": {"destroy_cq": {"cq": 1}}}),
        serde_json::json!({"call": {"dereg_mr": {"lkey": 257}}}),
        serde_json::json!({"call": {"remove_area": {"id": 1}}}),
    ] {
        let r = call(cmd.clone(), &[]);
        assert_eq!(r.status, libc::ENOENT, "{cmd}: {r:?}");
    }
    let pd = call(serde_json::json!({"call": "alloc_pd"}), &[]);
    let Some(ReplyBody::Call(ferroce_host::abi::ReplyData::Pd(pd))) = pd.data else {
        panic!("{pd:?}")
    };
    // Registering another client's area id (ids are per client): not found.
    let r = call(
        serde_json::json!({"call": {"reg_mr": {"pd": pd.0, "area": 1, "offset": 0, "len": 4096,
            "access": 15, "iova": 0}}}),
        &[],
    );
    assert_eq!(r.status, libc::ENOENT, "{r:?}");
    // Wrong fds: none, two, a pipe, an unsealed memfd, fds on a call that takes none.
    let (p0, p1) = {
        let mut f = [0; 2];
        // SAFETY: room for two fds.
        assert_eq!(unsafe { libc::pipe(f.as_mut_ptr()) }, 0);
        // SAFETY: fresh fds.
        unsafe { (OwnedFd::from_raw_fd(f[0]), OwnedFd::from_raw_fd(f[1])) }
    };
    let add = serde_json::json!({"call": {"add_area": {"id": 7}}});
    let sealed = memfd(1 << 16, true);
    for (fds, what) in [
        (vec![], "no fd"),
        (vec![sealed.as_fd(), sealed.as_fd()], "two fds"),
        (vec![p0.as_fd()], "a pipe"),
    ] {
        let r = call(add.clone(), &fds);
        assert_ne!(r.status, 0, "{what} accepted");
    }
    let unsealed = memfd(1 << 16, false);
    let r = call(add.clone(), &[unsealed.as_fd()]);
    assert_eq!(r.status, libc::EINVAL, "an unsealed memfd: {r:?}");
    assert!(format!("{:?}", r.error).contains("F_SEAL_SHRINK"), "{r:?}");
    let r = call(serde_json::json!({"call": "query_port"}), &[p1.as_fd()]);
    assert_eq!(r.status, libc::EPROTO, "{r:?}");
    // A sealed memfd is accepted, and then cannot be truncated under rnicd.
    assert_eq!(call(add.clone(), &[sealed.as_fd()]).status, 0);
    // SAFETY: ftruncate on our fd.
    assert!(
        unsafe { libc::ftruncate(sealed.as_raw_fd(), 0) } < 0,
        "truncated a sealed memfd"
    );
    // Huge lengths and offsets.
    for (off, len) in [(0u64, 1u64 << 40), (u64::MAX - 10, 100), (1 << 16, 1)] {
        let r = call(
            serde_json::json!({"call": {"reg_mr": {"pd": pd.0, "area": 7, "offset": off,
                "len": len, "access": 15, "iova": 4096}}}),
            &[],
        );
        assert_ne!(r.status, 0, "offset {off} len {len} accepted");
    }
    // A CQ ring too small, too large, not a power of two.
    for cap in [1u32 << 10, 1 << 30, 3] {
        let r = call(
            serde_json::json!({"call": {"create_cq": {"cqe": 16, "capacity": cap}}}),
            &[memfd(4096, true).as_fd()],
        );
        assert_ne!(r.status, 0, "CQ ring of {cap} slots accepted");
    }
    // 3. A flood of calls.
    for _ in 0..3000 {
        assert_eq!(
            call(serde_json::json!({"call": "query_port"}), &[]).status,
            0
        );
    }
    // 4. Garbage in its post ring: its context is closed, counted; rnicd goes on.
    let posts = Area::from_fd(ring_fds.into_iter().next().unwrap(), 4096).unwrap();
    for off in (128..4096).step_by(8) {
        posts.write_at(off, &rng.next_u64().to_le_bytes()).unwrap();
    }
    posts.write_at(64, &3u64.to_le_bytes()).unwrap(); // tail: three garbage slots
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = call(serde_json::json!({"call": "query_port"}), &[]);
        if r.status == libc::EIO {
            break; // closed: the context is dead (device fatal) to its client
        }
        assert!(
            Instant::now() < deadline,
            "a client writing garbage stayed attached"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Two more clients, each attached with a post ring that `scribble` writes into; after
    // a moment to read it, rnicd has closed the context: a call fails with EIO.
    let closed_for = |scribble: &dyn Fn(&Area)| {
        let s = SeqPacket::connect(&cfg.socket).unwrap();
        let (_, fds) = raw(&s, 1, hello("ferroce0"), &[]);
        scribble(&Area::from_fd(fds.into_iter().next().unwrap(), 4096).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        let query = Body::Call(ferroce_host::abi::Command::QueryPort);
        let (r, _) = raw(&s, 2, query, &[]);
        assert_eq!(r.status, libc::EIO, "{r:?}");
    };
    // A second one writing an absurd producer index.
    closed_for(&|posts| posts.write_at(64, &u64::MAX.to_le_bytes()).unwrap());
    // A third one publishing half a post: a well-formed head that calls for two cells,
    // and a producer index that publishes only the head.
    closed_for(&|posts| {
        let sges = [Sge::default(); 2];
        let post = PostCells::recv(post_kind::RECV, 0x11, 1, &sges).unwrap();
        assert_eq!(post.cells(), 2);
        let mut first = None;
        post.write(|c| {
            first.get_or_insert(*c);
        });
        posts.write_at(128, &first.unwrap().0).unwrap();
        posts.write_at(64, &1u64.to_le_bytes()).unwrap();
    });
    stop.store(true, Ordering::Relaxed);
    let n = victim.join().expect("the victim's traffic failed");
    assert!(n >= 20);
    assert!(d.runtime().alive());
    d.stop();
}

/// A victim's verified WRITEs from `a` to `b` in a thread, until the flag is set (and at
/// least 20); the thread returns how many, after checking that nothing but its own WRITEs
/// (at most 8431 bytes at offset 0) reached `b`'s memory.
fn victim_traffic(
    mut a: Side<RemoteContext>,
    b: Side<RemoteContext>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<u32>) {
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let victim = std::thread::spawn(move || {
        let mut n = 0u32;
        while !st.load(Ordering::Relaxed) || n < 20 {
            verified_write(&mut a, &b, n as u8, 4096 + (n % 256) as usize * 17);
            n += 1;
        }
        let rest = b.buf.to_vec(16384, (1 << 20) - 16384);
        assert!(
            rest.iter().all(|&x| x == 0),
            "a stray write reached the victim"
        );
        n
    });
    (stop, victim)
}

/// Drops `clients` (whatever holds the last clients and mappings); with every client gone,
/// RNIC 0 is back at `idle` objects, no client, no area, no mbuf in use; then the daemon
/// stops.
fn assert_reclaimed(d: Daemon, idle: roce::engine::ObjectCounts, clients: impl Sized) {
    drop(clients);
    let mut last = None;
    let reclaimed = wait_until(10, || {
        let s = d.runtime().stats(0);
        let done = s.objects == idle && s.hosts == 0 && s.area_bytes == 0 && s.mbufs_in_use == 0;
        last = Some(s);
        done
    });
    assert!(reclaimed, "not reclaimed: {last:?}");
    d.stop();
}

/// An RC side on `ferroce0` of rnicd at `socket`, and its client's mapping of its post ring
/// (held, so it stays mapped whatever rnicd unmaps when it closes the context).
fn side_with_ring(socket: &Path) -> (Side<RemoteContext>, Arc<Area>) {
    let s = side(remote(socket, "ferroce0"), QpType::Rc, 1 << 20, 64);
    let ring = s.ctx.post_ring().clone();
    (s, ring)
}

/// A context rnicd closed for garbage in its post ring is dead to its application at once:
/// posts fail with `DeviceFatal` (not `QueueFull` forever, as when only the event ring said
/// so) and the device-fatal event is reported once.
#[test]
fn a_context_closed_for_garbage_fails_its_posts_at_once() {
    let (cfg, d, idle) = started("closed-posts", 31, 32);
    let (mut a, own) = side_with_ring(&cfg.socket);
    let mut b = side(remote(&cfg.socket, "ferroce1"), QpType::Rc, 1 << 20, 64);
    connect_pair(&mut a, &mut b, Mtu::M4096, (300, 400), QpType::Rc);
    // Garbage cells published past whatever the client published (the producer index is
    // at byte 64, the cells from byte 128).
    let mut rng = roce::sim::Rng::new(5);
    for off in (128..own.len().min(128 + 64 * 16)).step_by(8) {
        own.write_at(off, &rng.next_u64().to_le_bytes()).unwrap();
    }
    own.write_at(64, &8u64.to_le_bytes()).unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: WrOp::Write {
            remote_addr: b.mr.addr,
            rkey: b.mr.rkey.unwrap(),
        },
        sg_list: &[a.mr.sge(0, 64)],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    // No call meanwhile (a control call would learn of the closure from its reply): the
    // application learns it from the event ring...
    assert!(
        wait_until(10, || a.ctx.poll_event() == Some(AsyncEvent::DeviceFatal)),
        "the context was not closed"
    );
    // ... and its next post fails, from the index area's state word; so do a poll of its
    // CQ once what was flushed is taken, and a wait on it (instead of waiting forever for a
    // worker that no longer serves it).
    assert_eq!(a.ctx.post_send(a.qpn, &wr), Err(VerbsError::DeviceFatal));
    let mut cqe = [Completion::default(); 16];
    let mut polled = Ok(1);
    for _ in 0..100 {
        polled = a.ctx.poll_cq(a.cq, &mut cqe);
        if polled.is_err() {
            break;
        }
    }
    assert_eq!(polled, Err(VerbsError::DeviceFatal));
    a.ctx.req_notify_cq(a.cq).ok();
    let t = Instant::now();
    assert_eq!(
        a.ctx.wait_cq(a.cq, Some(Duration::from_secs(5))),
        Err(VerbsError::DeviceFatal)
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(a.ctx.poll_event(), None, "device fatal reported twice");
    assert_reclaimed(d, idle, (own, a, b));
}

/// A client whose post ring is scribbled on by a thread of its own process while the client
/// library publishes valid WRITEs into it and rnicd's worker reads them: the worker copies
/// each post's cells once before decoding, so it decodes either a post as some moment's
/// bytes made it or garbage (which closes the context). rnicd must go on, another client's
/// verified traffic must not notice, and nothing but the scribbler's own bytes may land in
/// its peer's memory or anyone else's.
#[test]
fn a_client_scribbling_on_its_ring_while_rnicd_reads_it_harms_only_itself() {
    let (cfg, d, idle) = started("scribble", 27, 28);
    let (a, b) = rc_pair(&cfg.socket);
    let (stop, victim) = victim_traffic(a, b);
    let (mut a2, own) = side_with_ring(&cfg.socket);
    let ring = (own.addr() as usize, own.addr() as usize + own.len());
    let mut b2 = side(remote(&cfg.socket, "ferroce1"), QpType::Rc, 1 << 20, 64);
    connect_pair(&mut a2, &mut b2, Mtu::M4096, (300, 400), QpType::Rc);
    a2.buf.write(0, &vec![0xa5; 1 << 20]);
    // The scribbler: random bytes over the ring's cells (past the 128-byte header of
    // indices, which the client library keeps), in bursts.
    let sc = stop.clone();
    let scribbler = std::thread::spawn(move || {
        let _own = own;
        let mut rng = roce::sim::Rng::new(7);
        let mut writes = 0u64;
        while !sc.load(Ordering::Relaxed) {
            // Half the bytes where the race is: the cells just published (the worker reads
            // them) and those the client is filling (producer index at byte 64, 64-byte
            // cells from byte 128); the other half anywhere in the cells. Within a cell (each
            // post here is one head cell) mostly the fields that leave it a post that
            // decodes - wr_id, remote address, rkey, immediate (bytes 8-31), the SGE's
            // address, length and lkey (48-63) - so that WRITEs go out changed mid-read and
            // their keys and bounds are what stops them; one byte in 64 anywhere, which
            // (as garbage) closes the context sooner or later.
            // SAFETY: an aligned u64 inside the live mapping (see below).
            let tail = unsafe { (*((ring.0 + 64) as *const AtomicU64)).load(Ordering::Acquire) };
            let cells = ((ring.1 - ring.0 - 128) / 64) as u64;
            for i in 0..64 {
                let cell = if i % 2 == 0 {
                    (tail + cells - 2 + rng.below(4)) % cells
                } else {
                    rng.below(cells)
                };
                let byte = match rng.below(64) {
                    0 => rng.below(64),
                    _ => [8, 48][rng.below(2) as usize] + rng.below(16),
                };
                let at = ring.0 + 128 + cell as usize * 64 + byte as usize;
                // SAFETY: a byte inside `own`, this thread's mapping of the ring, alive until
                // the thread ends (it owns it); the race
                // with the client and the worker is the point, and both treat the ring's
                // bytes as untrusted.
                unsafe { std::ptr::write_volatile(at as *mut u8, rng.next_u64() as u8) };
                writes += 1;
            }
            std::thread::yield_now();
        }
        writes
    });
    // The scribbler's client posts valid WRITEs for three seconds and then until the
    // scribbling has shown (a WR in error) or rnicd closes the context; on a loaded machine
    // the scribbler may get little time, so the run is bounded by effect, capped at 30 s.
    let mut rng = roce::sim::Rng::new(8);
    let (mut posted, mut ok, mut failed, mut post_errors) = (0u64, 0u64, 0u64, 0u64);
    let mut last_error = None;
    let mut cqe = [Completion::default(); 16];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3)
        || (failed == 0 && start.elapsed() < Duration::from_secs(30))
    {
        let off = rng.below(1 << 19);
        let len = 1 + rng.below(4096) as u32;
        let wr = SendWr {
            wr_id: posted,
            op: WrOp::Write {
                remote_addr: b2.mr.addr + off,
                rkey: b2.mr.rkey.unwrap(),
            },
            sg_list: &[a2.mr.sge(off, len)],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        match a2.ctx.post_send(a2.qpn, &wr) {
            Ok(()) => posted += 1,
            Err(VerbsError::QueueFull) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => {
                post_errors += 1;
                let fatal = e == VerbsError::DeviceFatal;
                last_error = Some(e);
                if fatal {
                    break; // rnicd closed the context
                }
            }
        }
        match a2.ctx.poll_cq(a2.cq, &mut cqe) {
            Ok(n) => {
                for c in &cqe[..n] {
                    if c.status == WcStatus::Success {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
            Err(_) => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    // rnicd closes a context whose ring held garbage: its calls fail from then on.
    let closed = a2.ctx.query_qp(a2.qpn).err();
    let writes = scribbler.join().unwrap();
    let n = victim.join().expect("the victim's traffic failed");
    eprintln!(
        "{writes} bytes scribbled; {posted} WRITEs posted, {ok} completed, {failed} in error, \
         {post_errors} posts refused (last: {last_error:?}); the context closed by rnicd: \
         {closed:?}; the victim's verified WRITEs: {n}"
    );
    assert!(n >= 20 && posted > 0 && writes > 0);
    // The scribbling reached the worker (else this tested nothing): garbage closed the
    // context, or WRs decoded from changed cells ended in error.
    assert!(
        closed.is_some() || failed > 0,
        "the scribbling changed nothing"
    );
    assert!(d.runtime().alive());
    // The scribbler's peer holds only what the scribbler's memory held.
    let got = b2.buf.to_vec(0, 1 << 20);
    assert!(
        got.iter().all(|&x| x == 0 || x == 0xa5),
        "foreign bytes reached the peer"
    );
    // Everyone gone, everything reclaimed.
    assert_reclaimed(d, idle, (a2, b2));
}

/// A client posting work requests with bad SGEs as fast as it can - another client's lkey
/// and address, addresses and lengths past its own MR, made-up lkeys - and bringing its QP
/// back up after each error, next to another client's verified traffic: every such WR ends
/// in error (local protection: the lkey must name an MR of the QP's PD, and the
/// SGE must lie within it), nothing it names reaches its peer, the other client never
/// notices, and rnicd holds nothing afterwards.
#[test]
fn a_client_posting_bad_sges_at_full_speed_harms_only_itself() {
    let (cfg, d, idle) = started("bad-sges", 29, 30);
    let (a, b) = rc_pair(&cfg.socket);
    // The victim's source memory holds a marker the attacker's peer must never receive.
    a.buf.write(1 << 19, &[0x5a; 4096]);
    let victim_sge = a.mr.sge(1 << 19, 4096);
    let (stop, victim) = victim_traffic(a, b);
    let mut a2 = side(remote(&cfg.socket, "ferroce0"), QpType::Rc, 1 << 20, 64);
    let mut b2 = side(remote(&cfg.socket, "ferroce1"), QpType::Rc, 1 << 20, 64);
    connect_pair(&mut a2, &mut b2, Mtu::M4096, (500, 600), QpType::Rc);
    let mut rng = roce::sim::Rng::new(9);
    let (mut posted, mut refused, mut errors, mut rounds) = (0u64, 0u64, 0u64, 0u64);
    let mut cqe = [Completion::default(); 16];
    // Two seconds, and then until enough has happened to mean something (on a loaded machine
    // two seconds may hold few rounds), capped at 30 s.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2)
        || ((posted <= 100 || rounds <= 10) && start.elapsed() < Duration::from_secs(30))
    {
        let sge = match rng.below(4) {
            0 => victim_sge,
            1 => a2.mr.sge((1 << 20) - 8, 64), // runs past the MR's end
            2 => Sge {
                addr: a2.mr.addr.wrapping_sub(4096),
                ..a2.mr.sge(0, 64)
            },
            _ => Sge {
                lkey: roce::types::Lkey(rng.next_u64() as u32),
                ..a2.mr.sge(0, 64)
            },
        };
        let op = if rng.below(2) == 0 {
            WrOp::Send
        } else {
            WrOp::Write {
                remote_addr: b2.mr.addr,
                rkey: b2.mr.rkey.unwrap(),
            }
        };
        let wr = SendWr {
            wr_id: posted,
            op,
            sg_list: &[sge],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        match a2.ctx.post_send(a2.qpn, &wr) {
            Ok(()) => posted += 1,
            Err(_) => refused += 1,
        }
        let n = a2.ctx.poll_cq(a2.cq, &mut cqe).expect("poll");
        for c in &cqe[..n] {
            assert_ne!(c.status, WcStatus::Success, "a bad SGE succeeded: {c:?}");
            errors += 1;
            if c.status == WcStatus::LocProtErr || c.status == WcStatus::LocLenErr {
                // The QP is in the error state: back up from RESET, as an application would.
                let reset = QpAttr {
                    state: Some(QpState::Reset),
                    ..Default::default()
                };
                a2.ctx.modify_qp(a2.qpn, &reset).expect("RESET");
                ferroce_tests::connect_with(
                    &mut a2,
                    b2.qpn,
                    b2.gid,
                    Mtu::M4096,
                    500,
                    600,
                    QpType::Rc,
                    ferroce_tests::ACK_TIMEOUT,
                );
                rounds += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let n = victim.join().expect("the victim's traffic failed");
    eprintln!(
        "{posted} bad WRs posted, {refused} refused at the call, {errors} completed in error, \
         {rounds} times back from the error state; the victim's verified WRITEs: {n}"
    );
    assert!(
        posted > 100 && rounds > 10 && n >= 20,
        "the test did not run"
    );
    assert!(d.runtime().alive());
    // Nothing reached the attacker's peer: not the victim's marker, nothing at all.
    let got = b2.buf.to_vec(0, 1 << 20);
    assert!(
        got.iter().all(|&x| x == 0),
        "bytes reached the attacker's peer"
    );
    assert_reclaimed(d, idle, (a2, b2));
}

#[test]
fn per_client_limits_give_clear_errors() {
    let mut cfg = host_config("limits");
    cfg.max_qps = Some(1);
    cfg.max_cqs = Some(2);
    cfg.max_mrs = Some(1);
    cfg.max_pds = Some(1);
    cfg.max_area_bytes = 4 << 20;
    cfg.max_clients = 2;
    let d = daemon(&cfg, 21, 22);
    let mut c = remote(&cfg.socket, "ferroce0");
    let pd = c.alloc_pd().unwrap();
    assert_eq!(
        c.alloc_pd().unwrap_err(),
        VerbsError::NoResources("protection domains (host.max_pds)")
    );
    let cq = c.create_cq(16).unwrap();
    let init = roce::engine::QpInit::rc(pd, cq);
    c.create_qp(&init).unwrap();
    let e = c.create_qp(&init).unwrap_err();
    assert_eq!(e, VerbsError::NoResources("queue pairs (host.max_qps)"));
    c.create_cq(16).unwrap();
    let e = c.create_cq(16).unwrap_err();
    assert_eq!(
        e,
        VerbsError::NoResources("completion queues (host.max_cqs)")
    );
    let buf = c.alloc_buffer(1 << 20).unwrap();
    c.reg_mr(pd, &buf, 0, 4096, Access::LOCAL_WRITE).unwrap();
    let e = c
        .reg_mr(pd, &buf, 0, 4096, Access::LOCAL_WRITE)
        .unwrap_err();
    assert_eq!(e, VerbsError::NoResources("memory regions (host.max_mrs)"));
    let e = c.alloc_buffer(8 << 20).unwrap_err();
    assert!(e.to_string().contains("host.max_area_bytes"), "{e}");
    let _second = remote(&cfg.socket, "ferroce1");
    match connect(Some(&cfg.socket), None) {
        Err(ConnectError::Refused(WireError::NoResources(m))) => {
            assert!(m.contains("host.max_clients"), "{m}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a third client was admitted"),
    }
    drop(c);
    // A slot frees when a client leaves.
    assert!(wait_until(5, || connect(Some(&cfg.socket), None).is_ok()));
    d.stop();
}

/// A type 1 memory window names itself by its key alone; a client that learns (or guesses)
/// another's window key and MR key on the same RNIC must not be able to bind that window from
/// its own QP: the bind would choose the access and the new key over the other's memory.
#[test]
fn a_client_cannot_bind_another_clients_window() {
    use roce::memory::MwType;
    let (cfg, d, _) = started("foreign-mw", 39, 40);
    let (a, mut b) = rc_pair(&cfg.socket);
    // The victim: another context on b's RNIC, with a window of its own PD.
    let mut v = side(remote(&cfg.socket, "ferroce1"), QpType::Rc, 1 << 16, 16);
    // (a failed bind takes b's QP to the error state, so no WRITE follows it here: the
    // engine test `bind_errors_complete_mw_bind_err` covers the rule itself)
    let mw = v.ctx.alloc_mw(v.pd, MwType::One).expect("alloc_mw");
    let new_key = roce::types::Rkey((mw.0 & !0xff) | ((mw.0 + 1) & 0xff));
    // b binds it over all of the victim's buffer with remote write, from b's own QP.
    let bind = SendWr {
        wr_id: 9,
        op: WrOp::BindMw {
            mw,
            rkey: new_key,
            mr: v.mr.lkey,
            addr: v.mr.addr,
            length: 1 << 16,
            access: Access::REMOTE_WRITE,
        },
        sg_list: &[],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    b.ctx.post_send(b.qpn, &bind).expect("post the bind");
    let c = wait_cq(&mut b, 1, 10);
    assert_eq!(c.len(), 1, "the bind's completion");
    assert_eq!(
        (c[0].opcode, c[0].status),
        (WcOpcode::BindMw, WcStatus::MwBindErr),
        "another client's window was bound"
    );
    drop((a, b, v));
    d.stop();
}

#[test]
fn a_vanished_client_is_reclaimed() {
    let (cfg, d, idle) = started("vanish", 23, 24);
    {
        // A client that creates objects and disappears without a word (as when killed).
        let s = SeqPacket::connect(&cfg.socket).unwrap();
        assert_eq!(raw(&s, 1, hello("ferroce0"), &[]).0.status, 0);
        let r = raw(&s, 2, Body::Call(ferroce_host::abi::Command::AllocPd), &[]).0;
        assert_eq!(r.status, 0);
        let area = Area::new(1 << 16, "vanish").unwrap();
        let fd = area.dup_fd().unwrap();
        let r = raw(
            &s,
            3,
            Body::Call(ferroce_host::abi::Command::AddArea { id: 1 }),
            &[fd.as_fd()],
        )
        .0;
        assert_eq!(r.status, 0);
        let r = raw(
            &s,
            4,
            Body::Call(ferroce_host::abi::Command::RegMr {
                pd: roce::memory::PdId(1),
                area: 1,
                offset: 0,
                len: 4096,
                access: Access::ALL,
                iova: 0x1000,
            }),
            &[],
        )
        .0;
        assert_eq!(r.status, 0, "{r:?}");
        assert!(wait_until(5, || d.runtime().stats(0).objects.mrs != idle.mrs));
    }
    let mut last = None;
    let reclaimed = wait_until(5, || {
        let s = d.runtime().stats(0);
        let done = s.objects == idle && s.hosts == 0 && s.area_bytes == 0 && d.clients() == 0;
        last = Some(s);
        done
    });
    assert!(reclaimed, "not reclaimed: {last:?}");
    d.stop();
}

#[test]
fn stopping_rnicd_fails_clients_instead_of_hanging() {
    let (cfg, d, _) = started("stop", 25, 26);
    let (_a, mut b) = rc_pair(&cfg.socket);
    for i in 0..4 {
        post_recv_one(&mut b, i, 0, 64);
    }
    d.stop();
    // The posted receives complete as flushed, the device-fatal event arrives, calls fail.
    let c = wait_cq(&mut b, 4, 5);
    assert_eq!(c.len(), 4, "{c:?}");
    assert!(c.iter().all(|c| c.status == WcStatus::WrFlushErr), "{c:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = Vec::new();
    while !events.contains(&AsyncEvent::DeviceFatal) {
        assert!(
            Instant::now() < deadline,
            "no device-fatal event: {events:?}"
        );
        match b.ctx.poll_event() {
            Some(e) => events.push(e),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == AsyncEvent::DeviceFatal)
            .count(),
        1
    );
    assert_eq!(b.ctx.alloc_pd().unwrap_err(), VerbsError::DeviceFatal);
    assert_eq!(
        b.ctx
            .post_recv(
                b.qpn,
                &RecvWr {
                    wr_id: 9,
                    sg_list: &[]
                }
            )
            .unwrap_err(),
        VerbsError::DeviceFatal
    );
    assert!(!cfg.socket.exists());
}

/// An anonymous private mapping of `pages` pages, unmapped on drop.
struct Anon(*mut u8, usize);

impl Anon {
    fn new(pages: usize) -> Anon {
        let len = pages * 4096;
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Anon(p as *mut u8, len)
    }

    fn addr(&self) -> u64 {
        self.0 as u64
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes(&self) -> &mut [u8] {
        // SAFETY: our mapping; the test reads and writes it from one thread (the RNIC
        // writes it as a NIC's DMA would).
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
    }
}

/// rnicd (see `started`) with an RC pair of its clients, and four pages of the test's own
/// anonymous memory for them to register in place.
fn pair_and_memory(
    name: &str,
    a: u8,
    b: u8,
) -> (Daemon, Side<RemoteContext>, Side<RemoteContext>, Anon) {
    let (cfg, d, _) = started(name, a, b);
    let (a, b) = rc_pair(&cfg.socket);
    (d, a, b, Anon::new(4))
}

/// Posts one signaled WR on `s` and asserts that it completes successfully.
fn post_ok(s: &mut Side<RemoteContext>, op: WrOp, sge: Sge) {
    s.ctx
        .post_send(
            s.qpn,
            &SendWr {
                wr_id: 77,
                op,
                sg_list: &[sge],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    let c = wait_cq(s, 1, 10);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success);
}

/// Which way an RDMA operation of `rdma_ok` moves the bytes.
#[derive(Clone, Copy)]
enum Rdma {
    Write,
    Read,
}

/// RDMA WRITE of `s`'s buffer range `(offset, len)` to `remote_addr` in `mr`, or RDMA READ
/// of `remote_addr` in `mr` into that range, which must succeed.
fn rdma_ok(
    s: &mut Side<RemoteContext>,
    way: Rdma,
    (offset, len): (u64, u32),
    remote_addr: u64,
    mr: &dataplane::Mr,
) {
    let rkey = mr.rkey.unwrap();
    let op = match way {
        Rdma::Write => WrOp::Write { remote_addr, rkey },
        Rdma::Read => WrOp::Read { remote_addr, rkey },
    };
    let sge = s.mr.sge(offset, len);
    post_ok(s, op, sge);
}

#[test]
fn ordinary_memory_registers_in_place_and_both_views_are_the_same_bytes() {
    let (d, mut a, mut b, mem) = pair_and_memory("rawmr", 27, 28);
    let m = mem.bytes();
    for (i, x) in m.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let base = mem.addr();
    // SAFETY: no other thread touches `mem`.
    let mr1 = unsafe { a.ctx.reg_mr_addr(a.pd, base + 100, 5000, Access::ALL) }.unwrap();
    // Contents survived the move.
    assert!(m.iter().enumerate().all(|(i, x)| *x == (i % 251) as u8));
    // Two more MRs on the same pages reuse them.
    let mr2 = unsafe { a.ctx.reg_mr_addr(a.pd, base + 6000, 1000, Access::ALL) }.unwrap();
    let mr3 = unsafe { a.ctx.reg_mr_addr(a.pd, base + 200, 50, Access::ALL) }.unwrap();
    assert_eq!(
        (mr1.addr, mr2.addr, mr3.addr),
        (base + 100, base + 6000, base + 200)
    );
    // RNIC -> application: the peer WRITEs into mr2; the bytes appear in the memory.
    b.buf.write(0, &[0x5a; 700]);
    rdma_ok(&mut b, Rdma::Write, (0, 700), base + 6100, &mr2);
    assert!(m[6100..6800].iter().all(|x| *x == 0x5a));
    assert_eq!(m[6099], (6099 % 251) as u8);
    // Application -> RNIC: written through the memory, READ by the peer through mr3.
    m[210..230].copy_from_slice(&[0xc3; 20]);
    rdma_ok(&mut b, Rdma::Read, (4096, 20), base + 210, &mr3);
    assert_eq!(b.buf.to_vec(4096, 20), [0xc3; 20]);
    // The local side sends from mr1 (the RNIC reads the application's bytes).
    m[1000..1010].copy_from_slice(b"0123456789");
    post_recv_one(&mut b, 1, 8192, 64);
    post_ok(
        &mut a,
        WrOp::Send,
        Sge {
            addr: base + 1000,
            length: 10,
            lkey: mr1.lkey,
        },
    );
    assert_eq!(wait_cq(&mut b, 1, 10)[0].byte_len, 10);
    assert_eq!(b.buf.to_vec(8192, 10), b"0123456789");
    // After deregistering mr1 the memory is the application's as before; mr2 still works.
    a.ctx.dereg_mr(&mr1).unwrap();
    m[1000] = b'x';
    assert_eq!(&m[1000..1003], b"x12");
    b.buf.write(0, &[0x11; 8]);
    rdma_ok(&mut b, Rdma::Write, (0, 8), base + 6000, &mr2);
    assert_eq!(m[6000..6008], [0x11; 8]);
    // Pages unmapped and mapped anew at the same address are new memory: registering there
    // again moves the new pages (not the old memfd).
    let base2 = mem.addr() + 2 * 4096;
    let mr4 = unsafe { a.ctx.reg_mr_addr(a.pd, base2, 4096, Access::ALL) }.unwrap();
    a.ctx.dereg_mr(&mr4).unwrap();
    // SAFETY: replaces our own page with a fresh anonymous one.
    let p = unsafe {
        libc::mmap(
            base2 as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p as u64, base2);
    m[2 * 4096..3 * 4096].fill(0x77);
    let mr5 = unsafe { a.ctx.reg_mr_addr(a.pd, base2, 4096, Access::ALL) }.unwrap();
    b.buf.write(0, &[0x99; 16]);
    rdma_ok(&mut b, Rdma::Write, (0, 16), base2 + 8, &mr5);
    assert_eq!(
        m[2 * 4096 + 8..2 * 4096 + 24],
        [0x99; 16],
        "the new page got the WRITE"
    );
    assert_eq!(m[2 * 4096], 0x77, "its own contents were kept");
    // A range that only partly overlaps the moved pages: refused.
    let e = unsafe { a.ctx.reg_mr_addr(a.pd, base + 7000, 5000, Access::ALL) }.unwrap_err();
    assert!(e.to_string().contains("already moved"), "{e}");
    // Once no MR uses the earlier moves, their pages move again as one larger range (memory
    // freed and reused by the allocator): first pages 0-1 are idle but page 2 (mr5) is not.
    a.ctx.dereg_mr(&mr2).unwrap();
    a.ctx.dereg_mr(&mr3).unwrap();
    let e = unsafe { a.ctx.reg_mr_addr(a.pd, base + 7000, 5000, Access::ALL) }.unwrap_err();
    assert!(e.to_string().contains("already moved"), "{e}");
    a.ctx.dereg_mr(&mr5).unwrap();
    m[7000..7004].copy_from_slice(b"keep");
    // SAFETY: no other thread touches `mem`.
    let mr6 = unsafe { a.ctx.reg_mr_addr(a.pd, base + 7000, 5000, Access::ALL) }.unwrap();
    assert_eq!(&m[7000..7004], b"keep", "contents survive the second move");
    b.buf.write(0, &[0x42; 32]);
    rdma_ok(&mut b, Rdma::Write, (0, 32), base + 8180, &mr6);
    assert_eq!(m[8180..8212], [0x42; 32], "a WRITE across the old boundary");
    assert_eq!(m[7000], b'k');
    let path = std::env::temp_dir().join(format!("ferroce-rawmr-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: a private file mapping of our file.
    let fm = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(fm, libc::MAP_FAILED);
    // A private writable file mapping (as a program's .data/.bss, where static buffers live)
    // moves like anonymous memory, its contents kept, and takes a WRITE.
    // SAFETY: our mapping, 8 KiB.
    let fb = unsafe { std::slice::from_raw_parts_mut(fm as *mut u8, 8192) };
    fb[..4].copy_from_slice(b"data");
    let mr7 = unsafe { a.ctx.reg_mr_addr(a.pd, fm as u64 + 100, 100, Access::ALL) }.unwrap();
    assert_eq!(&fb[..4], b"data", "contents survive the move");
    b.buf.write(0, &[0x5a; 8]);
    rdma_ok(&mut b, Rdma::Write, (0, 8), fm as u64 + 100, &mr7);
    assert_eq!(fb[100..108], [0x5a; 8]);
    a.ctx.dereg_mr(&mr7).unwrap();
    // A read-only or a shared file mapping is the file's: refused.
    for (prot, flags) in [
        (libc::PROT_READ, libc::MAP_PRIVATE),
        (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED),
    ] {
        // SAFETY: a fresh mapping of our file.
        let ro = unsafe { libc::mmap(std::ptr::null_mut(), 4096, prot, flags, f.as_raw_fd(), 0) };
        assert_ne!(ro, libc::MAP_FAILED);
        let e = unsafe { a.ctx.reg_mr_addr(a.pd, ro as u64, 100, Access::ALL) }.unwrap_err();
        assert!(
            e.to_string().contains("read-only file-backed") || e.to_string().contains("shared"),
            "{e}"
        );
        // SAFETY: our mapping.
        unsafe { libc::munmap(ro, 4096) };
    }
    // SAFETY: our mapping.
    unsafe { libc::munmap(fm, 8192) };
    let _ = std::fs::remove_file(&path);
    drop((a, b));
    d.stop();
}

#[test]
fn a_completion_wakes_a_blocked_waiter() {
    let (cfg, d, _) = started("notify", 29, 30);
    let (mut a, mut b) = rc_pair(&cfg.socket);
    // Nothing happens: the wait times out.
    b.ctx.req_notify_cq(b.cq).unwrap();
    let t = Instant::now();
    assert!(!b
        .ctx
        .wait_cq(b.cq, Some(Duration::from_millis(200)))
        .unwrap());
    assert!(t.elapsed() >= Duration::from_millis(150));
    // A SEND arrives while b sleeps in wait_cq.
    post_recv_one(&mut b, 5, 0, 64);
    b.ctx.req_notify_cq(b.cq).unwrap();
    let mut wc = [Completion::default(); 4];
    assert_eq!(b.ctx.poll_cq(b.cq, &mut wc).unwrap(), 0);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        a.buf.write(0, b"wake");
        a.ctx
            .post_send(
                a.qpn,
                &SendWr {
                    wr_id: 1,
                    op: WrOp::Send,
                    sg_list: &[a.mr.sge(0, 4)],
                    flags: SendFlags::default(),
                    ud: None,
                },
            )
            .unwrap();
        a
    });
    assert!(
        b.ctx.wait_cq(b.cq, Some(Duration::from_secs(10))).unwrap(),
        "no wake-up"
    );
    assert_eq!(b.ctx.poll_cq(b.cq, &mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (5, 4));
    let a = sender.join().unwrap();
    // A CQ created later with the same id (ids come back once the others were handed out)
    // starts with no notification: the old ring's sequence must not make a waiter (or a
    // completion channel) wake at once.
    b.ctx.destroy_qp(b.qpn).unwrap();
    b.ctx.destroy_cq(b.cq).unwrap();
    let mut fresh = b.ctx.create_cq(16).unwrap();
    for _ in 0..4096 {
        if fresh == b.cq {
            break;
        }
        b.ctx.destroy_cq(fresh).unwrap();
        fresh = b.ctx.create_cq(16).unwrap();
    }
    assert_eq!(fresh, b.cq, "the id is reused (else this checks nothing)");
    assert!(
        !b.ctx
            .wait_cq(fresh, Some(Duration::from_millis(200)))
            .unwrap(),
        "a new CQ woke its waiter without a completion"
    );
    drop((a, b));
    d.stop();
}

/// Descriptors open in this process (the daemon and its clients share it here).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Unset per-client limits are a share of the device, not all of it: one client that takes
/// every PD (or queue memory) it may still leaves room for another.
#[test]
fn default_limits_leave_room_for_other_clients() {
    let mut cfg = host_config("shares");
    cfg.max_queue_bytes = 8 << 20;
    let d = daemon(&cfg, 31, 32);
    let dev = d.runtime().device_limits(0);
    let mut greedy = remote(&cfg.socket, "ferroce0");
    let mut pds = Vec::new();
    let err = loop {
        match greedy.alloc_pd() {
            Ok(p) => pds.push(p),
            Err(e) => break e,
        }
        assert!(pds.len() <= dev.max_pd as usize, "no per-client PD limit");
    };
    assert_eq!(
        err,
        VerbsError::NoResources("protection domains (host.max_pds)")
    );
    assert_eq!(
        pds.len() as u32,
        dev.max_pd / dataplane::config::DEFAULT_CLIENT_SHARE
    );
    // Queue memory: large queues until the client's budget is spent.
    let cq = greedy.create_cq(64).unwrap();
    let init = roce::engine::QpInit {
        caps: QpCaps {
            max_send_wr: 4096,
            max_recv_wr: 4096,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
        },
        ..roce::engine::QpInit::rc(pds[0], cq)
    };
    let mut qps = 0;
    let err = loop {
        match greedy.create_qp(&init) {
            Ok(_) => qps += 1,
            Err(e) => break e,
        }
        assert!(qps < 64, "queue memory not counted");
    };
    assert_eq!(
        err,
        VerbsError::NoResources("queue memory (host.max_queue_bytes)")
    );
    let big_cq = greedy.create_cq(dev.max_cqe).unwrap_err();
    assert_eq!(
        big_cq,
        VerbsError::NoResources("queue memory (host.max_queue_bytes)")
    );
    // Another client still gets everything it needs and moves verified data.
    let (mut a, b) = rc_pair(&cfg.socket);
    verified_write(&mut a, &b, 7, 10_000);
    drop((a, b, greedy));
    d.stop();
}

/// rnicd keeps no descriptor per client area (the mapping outlives the fd), and a client's
/// areas are bounded by host.max_areas: one client adding areas as fast as it can neither
/// exhausts rnicd's descriptors nor stops another client from connecting and working.
#[test]
fn client_areas_cost_no_descriptors_and_are_bounded() {
    let mut cfg = host_config("areas");
    cfg.max_areas = 200;
    let d = daemon(&cfg, 33, 34);
    let mut hog = remote(&cfg.socket, "ferroce0");
    let before = open_fds();
    let mut bufs = Vec::new();
    let err = loop {
        match hog.alloc_buffer(4096) {
            Ok(b) => bufs.push(b),
            Err(e) => break e,
        }
        assert!(bufs.len() <= 200, "no area limit");
    };
    assert_eq!(
        err,
        VerbsError::NoResources("memory areas (host.max_areas)")
    );
    assert_eq!(bufs.len(), 200);
    // The count is process-wide and other tests run in parallel threads of this process, so a
    // few descriptors come and go meanwhile; one kept per area would show as 200 or more.
    let grown = open_fds().saturating_sub(before);
    assert!(
        grown < bufs.len() / 4,
        "{grown} more descriptors open for {} areas (daemon and client in this process)",
        bufs.len()
    );
    // The areas are real: an MR on the last one works.
    let pd = hog.alloc_pd().unwrap();
    hog.reg_mr(pd, bufs.last().unwrap(), 0, 4096, Access::LOCAL_WRITE)
        .unwrap();
    // Another client connects and moves verified data meanwhile.
    let (mut a, b) = rc_pair(&cfg.socket);
    verified_write(&mut a, &b, 9, 8192);
    drop((a, b));
    // Freed areas make room again.
    bufs.truncate(100);
    hog.alloc_buffer(4096).unwrap();
    drop((bufs, hog));
    d.stop();
}

/// A hugetlb memfd (sealed, large enough) is refused: its pages can run out after rnicd
/// mapped it, and a fault in the worker would take rnicd down for every client.
#[test]
fn a_hugetlb_memfd_is_refused() {
    let name = std::ffi::CString::new("huge").unwrap();
    // SAFETY: valid name; checked.
    let raw_fd = unsafe {
        libc::memfd_create(
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
        )
    };
    if raw_fd < 0 {
        eprintln!(
            "skipped: no hugetlb memfd here ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw_fd) };
    // SAFETY: our fd (either call may fail without hugepages; the refusal comes first).
    unsafe {
        libc::ftruncate(fd.as_raw_fd(), 2 << 20);
        libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK);
    }
    let (cfg, d, _) = started("hugetlb", 35, 36);
    let s = SeqPacket::connect(&cfg.socket).unwrap();
    assert_eq!(raw(&s, 1, hello("ferroce0"), &[]).0.status, 0);
    let (r, _) = raw(
        &s,
        2,
        Body::Call(ferroce_host::abi::Command::AddArea { id: 1 }),
        &[fd.as_fd()],
    );
    assert_eq!(r.status, libc::EINVAL, "{r:?}");
    assert!(format!("{:?}", r.error).contains("hugetlb"), "{r:?}");
    d.stop();
}

/// Whether the page at `addr` is one of ferroce's moved (memfd) mappings.
fn is_moved(addr: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| {
        let Some((range, rest)) = l.split_once(' ') else {
            return false;
        };
        let Some((s, e)) = range.split_once('-') else {
            return false;
        };
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        s <= addr && addr < e && rest.contains(ferroce_host::app::shadow::SHADOW_NAME)
    })
}

/// Multi-rail: one ordinary buffer registered on two RNICs (two contexts of one process)
/// is one memory for both; when the last registration goes, the pages are private
/// anonymous memory again (MADV_DONTNEED zeroes them, mremap grows them); and a forked
/// child gets a private copy of registered pages instead of sharing them with the parent.
#[test]
fn one_buffer_on_two_rnics_then_private_again() {
    let (d, mut a, mut b, mem) = pair_and_memory("multirail", 37, 38);
    let m = mem.bytes();
    m.fill(0x31);
    let base = mem.addr();
    // SAFETY: no other thread touches `mem`.
    let mr_a = unsafe { a.ctx.reg_mr_addr(a.pd, base, 4 * 4096, Access::ALL) }.unwrap();
    let mr_b = unsafe { b.ctx.reg_mr_addr(b.pd, base + 4096, 4096, Access::ALL) }
        .expect("the same buffer on a second RNIC");
    assert!(is_moved(base));
    // Through RNIC 1: b's peer (a) WRITEs into the buffer via b's MR ...
    a.buf.write(0, &[0x5a; 64]);
    rdma_ok(&mut a, Rdma::Write, (0, 64), base + 4096, &mr_b);
    assert_eq!(m[4096..4160], [0x5a; 64]);
    // ... and through RNIC 0 the same bytes are READ via a's MR.
    rdma_ok(&mut b, Rdma::Read, (0, 64), base + 4096, &mr_a);
    assert_eq!(b.buf.to_vec(0, 64), [0x5a; 64]);
    // A forked child writes its copy; the parent's memory (and the RNICs') is untouched.
    // SAFETY: the child only writes memory and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        m[4096] = 0xee;
        let private = !is_moved(base);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(if private { 0 } else { 3 }) };
    }
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's pages are private"
    );
    assert_eq!(m[4096], 0x5a, "the child's write stayed in the child");
    assert!(is_moved(base), "the parent's are still registered");
    // The first deregistration leaves the move (b's MR still uses it) ...
    a.ctx.dereg_mr(&mr_a).unwrap();
    assert!(is_moved(base));
    assert_eq!(ferroce_host::app::shadow::users(base), 1);
    // ... the last makes the pages private again, contents kept.
    b.ctx.dereg_mr(&mr_b).unwrap();
    assert!(!is_moved(base) && !is_moved(base + 4096));
    assert_eq!((m[0], m[4096], m[4160]), (0x31, 0x5a, 0x31));
    // SAFETY: our pages; private anonymous memory reads back zero after MADV_DONTNEED.
    assert_eq!(
        unsafe { libc::madvise(mem.0 as *mut libc::c_void, 4096, libc::MADV_DONTNEED) },
        0
    );
    assert_eq!(m[0], 0, "MADV_DONTNEED behaves as on ordinary memory");
    // realloc of a large block grows it with mremap: fine on private memory (on the memfd
    // the pages past its end would fault).
    // SAFETY: mremap of our mapping; the result replaces `mem`'s.
    let grown = unsafe {
        libc::mremap(
            mem.0 as *mut libc::c_void,
            4 * 4096,
            16 * 4096,
            libc::MREMAP_MAYMOVE,
        )
    };
    assert_ne!(grown, libc::MAP_FAILED);
    // SAFETY: the grown mapping is ours, 16 pages.
    let g = unsafe { std::slice::from_raw_parts_mut(grown as *mut u8, 16 * 4096) };
    g[16 * 4096 - 1] = 1;
    assert_eq!(g[4096], 0x5a);
    // SAFETY: ours; `mem` must not unmap the old address again.
    unsafe { libc::munmap(grown, 16 * 4096) };
    std::mem::forget(mem);
    drop((a, b));
    d.stop();
}

/// A sleeping worker wakes for a request or a post at once: with a 3 s idle sleep and almost
/// no spinning first, setting up a connected pair (a dozen control calls) and three WRITEs
/// posted after the worker went to sleep each take far less than one sleep. Without the
/// wake-ups (control queue word, armed post rings) every one of them waited for the sleep to
/// end.
#[test]
fn a_sleeping_worker_wakes_for_requests_and_posts() {
    let cfg = host_config("wake");
    let mk = |h: u8| {
        let mut c = test_config(h, 4096);
        c.idle_spin = 1;
        c.idle_pause = 1;
        c.idle_sleep_us = 3_000_000;
        c
    };
    let rt = Runtime::loopback("ferroce-daemon", mk(21), mk(22)).expect("loopback");
    let d = Daemon::start(rt, &cfg).expect("daemon");
    let t = Instant::now();
    let (mut a, b) = rc_pair(&cfg.socket);
    let setup = t.elapsed();
    let mut posts = Vec::new();
    for seed in 1..=3u8 {
        std::thread::sleep(Duration::from_millis(30));
        let t = Instant::now();
        verified_write(&mut a, &b, seed, 8192);
        posts.push(t.elapsed());
    }
    assert!(
        setup < Duration::from_secs(2) && posts.iter().all(|p| *p < Duration::from_secs(1)),
        "setup {setup:?}, WRITEs {posts:?} (the worker sleeps 3 s at a time)"
    );
    drop((a, b));
    d.stop();
}
