//! Memory windows (IBA 10.6.7; rxe_mw.c's behaviour, stricter where the IBA is): type 1 and
//! type 2 binds, the responder's checks (window access and range, the bound QP of a type 2
//! window, the key byte), local and remote invalidation, unbinding, and every bind error with
//! its MW_BIND_ERR completion and the QP in error; all on the wire between two devices.

use roce::engine::QpInit;
use roce::memory::MwType;
use roce::sim::{connect, ConnectOpts, Endpoint, Pair};
use roce::types::{Lkey, Rkey};
use roce::verbs::*;

const SEC: u64 = 1_000_000_000;

fn setup() -> (Pair, Endpoint, Endpoint) {
    let mut p = Pair::lossless();
    let o = ConnectOpts {
        access: Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::MW_BIND,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    (p, a, b)
}

/// The next key of a window (`ibv_inc_rkey`: the low byte plus one).
fn inc(k: Rkey) -> Rkey {
    Rkey((k.0 & !0xff) | ((k.0 + 1) & 0xff))
}

/// A new window of type `ty` in B's PD; its (initial) key.
fn alloc(p: &mut Pair, b: &Endpoint, ty: MwType) -> Rkey {
    p.node(1).dev.alloc_mw(b.pd, ty).unwrap()
}

/// Binds window `mw` of B with the new key `new` to `(addr, length)` of B's MR with
/// `access`, through B's send queue; returns the bind's completion.
fn bind(
    p: &mut Pair,
    b: &Endpoint,
    mw: Rkey,
    new: Rkey,
    (addr, length): (u64, u64),
    access: Access,
) -> Completion {
    p.post(
        1,
        b,
        77,
        bind_op(mw, new, b.lkey, (addr, length), access),
        &[],
    );
    p.run_until_idle(SEC);
    let c = p.cqes(1, b);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].opcode, WcOpcode::BindMw);
    c[0]
}

/// The BIND_MW work request.
fn bind_op(mw: Rkey, rkey: Rkey, mr: Lkey, range: (u64, u64), access: Access) -> WrOp {
    WrOp::BindMw {
        mw,
        rkey,
        mr,
        addr: range.0,
        length: range.1,
        access,
    }
}

/// A fresh pair with a window of type `ty` bound (successfully) to B's first page for remote
/// write; returns the window's key.
fn setup_bound(ty: MwType) -> (Pair, Endpoint, Endpoint, Rkey) {
    setup_window(ty, (0, 4096), Access::REMOTE_WRITE)
}

/// A fresh pair with a window of type `ty` bound (successfully) with `access` to `length`
/// bytes at `offset` in B's MR; returns the window's key.
fn setup_window(
    ty: MwType,
    (offset, length): (u64, u64),
    access: Access,
) -> (Pair, Endpoint, Endpoint, Rkey) {
    let (mut p, a, b) = setup();
    let mw = alloc(&mut p, &b, ty);
    let key = inc(mw);
    let c = bind(&mut p, &b, mw, key, (b.addr + offset, length), access);
    assert_eq!(c.status, WcStatus::Success);
    (p, a, b, key)
}

/// A signaled WRITE of 16 bytes of 0x5a from A to `addr` with `rkey`; its status.
fn write(p: &mut Pair, a: &Endpoint, addr: u64, rkey: Rkey) -> WcStatus {
    p.write_status(a, addr, rkey, &[0x5a; 16])
}

#[test]
fn type2_window_grants_its_own_range_and_access_to_its_qp() {
    let (mut p, a, b) = setup();
    let mw = alloc(&mut p, &b, MwType::Two);
    assert_eq!(
        write(&mut p, &a, b.addr, mw),
        WcStatus::RemAccessErr,
        "a FREE window grants nothing"
    );
    let (mut p, a, b, key) = setup_window(MwType::Two, (4096, 4096), Access::REMOTE_WRITE);
    assert_eq!(
        write(&mut p, &a, b.addr + 4096 + 100, key),
        WcStatus::Success
    );
    assert_eq!(b.mem.to_vec(4196, 16), vec![0x5a; 16]);
    // Inside the MR but outside the window: refused (rxe checks only the MR).
    assert_eq!(write(&mut p, &a, b.addr + 100, key), WcStatus::RemAccessErr);
    assert_eq!(b.mem.to_vec(100, 16), vec![0; 16]);
}

#[test]
fn the_windows_access_counts_not_the_mrs() {
    // The MR grants remote write; the window only remote read.
    let (mut p, a, b, key) = setup_window(MwType::Two, (0, 4096), Access::REMOTE_READ);
    assert_eq!(write(&mut p, &a, b.addr, key), WcStatus::RemAccessErr);
    assert_eq!(b.mem.to_vec(0, 16), vec![0; 16]);
}

#[test]
fn old_keys_fail_after_a_rebind_and_zero_based_windows_start_at_zero() {
    let (mut p, a, b, k1) = setup_window(MwType::One, (0, 8192), Access::REMOTE_WRITE);
    let range = (b.addr, 8192);
    assert_eq!(write(&mut p, &a, b.addr + 8, k1), WcStatus::Success);
    // Type 1 rebinds in place with a new key byte: the old key is dead.
    let k2 = inc(k1);
    let c = bind(&mut p, &b, k1, k2, range, Access::REMOTE_WRITE);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(write(&mut p, &a, b.addr + 8, k2), WcStatus::Success);
    assert_eq!(write(&mut p, &a, b.addr + 8, k1), WcStatus::RemAccessErr);

    let zb = Access::REMOTE_WRITE | Access::ZERO_BASED;
    let (mut p, a, b, key) = setup_window(MwType::Two, (3 * 4096, 4096), zb);
    // Address 32 of the window is byte 32 of its range.
    assert_eq!(write(&mut p, &a, 32, key), WcStatus::Success);
    assert_eq!(b.mem.to_vec(3 * 4096 + 32, 16), vec![0x5a; 16]);
    assert_eq!(write(&mut p, &a, 4090, key), WcStatus::RemAccessErr);
}

#[test]
fn a_type2_window_serves_only_the_qp_that_bound_it() {
    let (mut p, a, b) = setup();
    let o = ConnectOpts::default();
    // A second connection whose B side is a QP of b's own PD, on b's CQ and MR.
    let a2 = roce::sim::endpoint(&mut p.a.dev, &o, 0x30_0000_0000);
    let qpn = p.b.dev.create_qp(&QpInit::rc(b.pd, b.cq)).unwrap();
    let b2 = b.with_qp(qpn);
    roce::sim::bring_up(&mut p.a.dev, &a2, b2.qpn, roce::sim::node_gid(1), &o, 7, 9);
    roce::sim::bring_up(&mut p.b.dev, &b2, a2.qpn, roce::sim::node_gid(0), &o, 9, 7);
    let mw = alloc(&mut p, &b, MwType::Two);
    let key = inc(mw);
    // Bound by b's QP: a (its peer) may use it ...
    let c = bind(&mut p, &b, mw, key, (b.addr, 4096), Access::REMOTE_WRITE);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(write(&mut p, &a, b.addr, key), WcStatus::Success);
    // ... but not a2 through b2, a QP of the same PD.
    assert_eq!(write(&mut p, &a2, b.addr + 64, key), WcStatus::RemAccessErr);
    assert_eq!(b.mem.to_vec(64, 16), vec![0; 16]);
}

#[test]
fn local_and_remote_invalidation_of_a_type2_window() {
    let (mut p, a, b, key) = setup_bound(MwType::Two);
    p.post(1, &b, 9, WrOp::LocalInv { rkey: key }, &[]);
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b);
    assert_eq!(
        (c[0].opcode, c[0].status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    assert_eq!(write(&mut p, &a, b.addr, key), WcStatus::RemAccessErr);

    // Remote: a SEND with invalidate from the peer.
    let (mut p, a, b, key) = setup_bound(MwType::Two);
    p.recv(1, &b, 5, &[b.sge(8192, 64)]);
    p.post(0, &a, 2, WrOp::SendWithInv { rkey: key }, &[a.sge(0, 8)]);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    let r = p.cqes(1, &b);
    assert_eq!(r[0].status, WcStatus::Success);
    assert!(r[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r[0].invalidated_rkey, key.0);
    // The FREE window binds again with a new key; the invalidated key stays dead.
    let k2 = inc(key);
    let c = bind(&mut p, &b, key, k2, (b.addr, 4096), Access::REMOTE_WRITE);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(write(&mut p, &a, b.addr, k2), WcStatus::Success);
    assert_eq!(write(&mut p, &a, b.addr, key), WcStatus::RemAccessErr);
}

#[test]
fn type1_windows_unbind_with_length_zero_and_cannot_be_invalidated() {
    let (mut p, a, b, k1) = setup_bound(MwType::One);
    assert_eq!(write(&mut p, &a, b.addr, k1), WcStatus::Success);
    let k2 = inc(k1);
    let c = bind(&mut p, &b, k1, k2, (0, 0), Access(0));
    assert_eq!(c.status, WcStatus::Success, "unbound");
    assert_eq!(write(&mut p, &a, b.addr, k2), WcStatus::RemAccessErr);
    // The MR can go now (nothing is bound to it).
    let (mut p, _a, b, k1) = setup_bound(MwType::One);
    p.post(1, &b, 9, WrOp::LocalInv { rkey: k1 }, &[]);
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b);
    assert_eq!(c[0].status, WcStatus::LocQpOpErr, "type 1: no LOCAL_INV");
    assert_eq!(p.qp_state(1, &b), QpState::Err);
}

#[test]
fn remote_invalidation_of_a_type1_window_is_refused() {
    let (mut p, a, b, k1) = setup_bound(MwType::One);
    p.recv(1, &b, 5, &[b.sge(8192, 64)]);
    p.post(0, &a, 2, WrOp::SendWithInv { rkey: k1 }, &[a.sge(0, 8)]);
    p.run_until_idle(SEC);
    let r = p.cqes(1, &b);
    assert_eq!(r[0].status, WcStatus::RemInvReqErr, "{r:?}");
    assert_eq!(p.qp_state(1, &b), QpState::Err);
}

/// A fresh MR of 4096 bytes at 0x7000 in B's PD with only `access`; its lkey.
fn mr_with(p: &mut Pair, b: &Endpoint, access: Access) -> Lkey {
    let mem = roce::memory::HeapMemory::shared(4096);
    let dev = &mut p.node(1).dev;
    dev.reg_mr(b.pd, mem, 0, 0x7000, 4096, access).unwrap().0
}

/// Each broken rule of a bind: MW_BIND_ERR, and the QP goes to the error state.
#[test]
fn bind_errors_complete_mw_bind_err() {
    type Case = fn(&mut Pair, &Endpoint) -> WrOp;
    const READ: Access = Access::REMOTE_READ;
    let cases: [(&str, Case); 8] = [
        ("a stale window key", |p, b| {
            let mw = alloc(p, b, MwType::Two);
            bind_op(inc(inc(mw)), inc(mw), b.lkey, (b.addr, 64), READ)
        }),
        ("an MR without MW_BIND", |p, b| {
            let lkey = mr_with(p, b, Access::LOCAL_WRITE);
            let mw = alloc(p, b, MwType::Two);
            bind_op(mw, inc(mw), lkey, (0x7000, 64), READ)
        }),
        ("remote write through an MR without local write", |p, b| {
            let lkey = mr_with(p, b, Access::MW_BIND);
            let mw = alloc(p, b, MwType::Two);
            bind_op(mw, inc(mw), lkey, (0x7000, 64), Access::REMOTE_WRITE)
        }),
        ("a window past the MR", |p, b| {
            let mw = alloc(p, b, MwType::Two);
            let past = (b.addr + (1 << 20) - 8, 64);
            bind_op(mw, inc(mw), b.lkey, past, READ)
        }),
        ("a type 2 window of another PD", |p, b| {
            let dev = &mut p.node(1).dev;
            let pd = dev.alloc_pd().unwrap();
            let mw = dev.alloc_mw(pd, MwType::Two).unwrap();
            bind_op(mw, inc(mw), b.lkey, (b.addr, 64), READ)
        }),
        // Another tenant's window and MR (both of its PD), bound from a QP of this PD: the
        // window would grant whatever access the binder chose over the other's memory.
        ("a type 1 window and MR of another PD", |p, _b| {
            let dev = &mut p.node(1).dev;
            let pd = dev.alloc_pd().unwrap();
            let mem = roce::memory::HeapMemory::shared(4096);
            let access = Access::LOCAL_WRITE | Access::MW_BIND;
            let (lkey, _) = dev.reg_mr(pd, mem, 0, 0x7000, 4096, access).unwrap();
            let mw = dev.alloc_mw(pd, MwType::One).unwrap();
            bind_op(mw, inc(mw), lkey, (0x7000, 64), Access::REMOTE_WRITE)
        }),
        ("a zero-based type 1 window", |p, b| {
            let mw = alloc(p, b, MwType::One);
            let zb = READ | Access::ZERO_BASED;
            bind_op(mw, inc(mw), b.lkey, (b.addr, 64), zb)
        }),
        ("a type 2 window with length 0", |p, b| {
            let mw = alloc(p, b, MwType::Two);
            bind_op(mw, inc(mw), b.lkey, (b.addr, 0), READ)
        }),
    ];
    for (what, make) in cases {
        let (mut p, _a, b) = setup();
        let op = make(&mut p, &b);
        p.post(1, &b, 3, op, &[]);
        p.run_until_idle(SEC);
        let c = p.cqes(1, &b);
        assert_eq!(
            (c[0].opcode, c[0].status),
            (WcOpcode::BindMw, WcStatus::MwBindErr),
            "{what}"
        );
        assert_eq!(p.qp_state(1, &b), QpState::Err, "{what}");
    }
    // Binding a type 2 window that is already bound.
    let (mut p, _a, b) = setup();
    let mw = alloc(&mut p, &b, MwType::Two);
    let k = inc(mw);
    let c = bind(&mut p, &b, mw, k, (b.addr, 64), READ);
    assert_eq!(c.status, WcStatus::Success);
    let c = bind(&mut p, &b, k, inc(k), (b.addr, 64), READ);
    assert_eq!(c.status, WcStatus::MwBindErr, "a bound type 2 window");
}

#[test]
fn bound_windows_hold_their_mr_and_go_with_dealloc_or_their_qp() {
    let (mut p, a, b, k) = setup_bound(MwType::Two);
    let dev = &mut p.node(1).dev;
    assert!(dev.dereg_mr(b.lkey).is_err(), "a window is bound to it");
    assert!(dev.dealloc_pd(b.pd).is_err());
    dev.dealloc_mw(k).unwrap();
    assert_eq!(write(&mut p, &a, b.addr, k), WcStatus::RemAccessErr);
    p.node(1).dev.dereg_mr(b.lkey).unwrap();

    // Destroying the QP a type 2 window is bound to invalidates it.
    let (mut p, _a, b, k) = setup_bound(MwType::Two);
    let dev = &mut p.node(1).dev;
    dev.destroy_qp(b.qpn).unwrap();
    assert_eq!(dev.mw_key(k), Some((k, false)), "FREE, key kept");
    dev.dereg_mr(b.lkey).unwrap();
}
