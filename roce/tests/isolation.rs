//! Tenant isolation in the transport: state that outlives one packet (a multi-packet WRITE
//! being placed, a READ being answered, an inline SGE) never reaches memory outside the
//! registration and protection domain it was checked against, even when the key comes back
//! for another MR after `dereg_mr`.

use std::sync::Arc;

use roce::engine::{DeviceConfig, DeviceLimits, Transmit};
use roce::memory::{HeapMemory, Memory, PdId};
use roce::sim::{connect, ConnectOpts, Endpoint, LinkConfig, Pair};
use roce::types::{Lkey, Rkey};
use roce::verbs::*;
use roce::wire::bth::BthRepr;
use roce::wire::frame::TransportRepr;
use roce::wire::opcode::Opcode;
use roce::wire::reth::RethRepr;

const SEC: u64 = 1_000_000_000;
const MTU: usize = 1024;
/// The NAK syndrome of a remote access error.
const NAK_REMOTE_ACCESS: u8 = 0x62;

/// A pair whose responder (B) has room for exactly one MR, so that every registration after
/// a deregistration takes the same table index and the key byte cycles through 256 values.
fn setup() -> (Pair, Endpoint, Endpoint) {
    let a = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let b = DeviceConfig {
        port_mtu: Mtu::M4096,
        limits: DeviceLimits {
            max_mr: 1,
            max_mw: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = Pair::new(a, b, LinkConfig::default(), 3);
    p.record = true;
    let o = ConnectOpts {
        mtu: Mtu::M1024,
        ..Default::default()
    };
    let (ea, eb) = connect(&mut p, &o);
    (p, ea, eb)
}

/// Deregisters B's MR, then registers and deregisters in B's own PD until the next
/// registration will get the old key back, and registers `victim` there in `pd`: returns the
/// victim's keys, which equal the old ones.
fn recycle_key_to(
    p: &mut Pair,
    b: &Endpoint,
    pd: PdId,
    victim: Arc<HeapMemory>,
) -> (Lkey, Option<Rkey>) {
    let dev = &mut p.node(1).dev;
    dev.dereg_mr(b.lkey).unwrap();
    for _ in 0..255 {
        let (l, _) = dev
            .reg_mr(
                b.pd,
                HeapMemory::shared(64),
                0,
                0x9000,
                64,
                Access::LOCAL_WRITE,
            )
            .unwrap();
        dev.dereg_mr(l).unwrap();
    }
    let len = victim.len() as u64;
    let keys = dev
        .reg_mr(
            pd,
            victim,
            0,
            b.addr,
            len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    assert_eq!(keys.0, b.lkey, "the old key came back for the victim's MR");
    keys
}

fn write_packet(
    p: &Pair,
    op: u8,
    a: &Endpoint,
    b: &Endpoint,
    psn_off: u32,
    reth: Option<RethRepr>,
) -> Vec<u8> {
    let mut t = TransportRepr::new(BthRepr::new(Opcode(op), b.qpn, a.sq_psn.add(psn_off)));
    t.bth.ack_req = op == 0x08;
    t.ext.reth = reth;
    p.craft(0, t, &[0x5a; MTU])
}

/// Delivers the FIRST packet of a three-packet WRITE from A to the start of B's MR (0x5a
/// bytes) and runs until idle.
fn write_first(p: &mut Pair, a: &Endpoint, b: &Endpoint) {
    let reth = RethRepr {
        va: b.addr,
        rkey: b.rkey,
        len: 3 * MTU as u32,
    };
    let first = write_packet(p, 0x06, a, b, 0, Some(reth));
    p.inject(1, &first);
    p.run_until_idle(SEC);
}

/// Delivers the later packets of [`write_first`]'s WRITE, as (opcode, PSN offset), running
/// until idle after each.
fn write_rest(p: &mut Pair, a: &Endpoint, b: &Endpoint, packets: &[(u8, u32)]) {
    for &(op, off) in packets {
        let f = write_packet(p, op, a, b, off, None);
        p.inject(1, &f);
        p.run_until_idle(SEC);
    }
}

/// Checks that `mem` (4 MTUs) still holds only zeros.
fn assert_untouched(mem: &HeapMemory, what: &str) {
    assert_eq!(mem.to_vec(0, 4 * MTU), vec![0; 4 * MTU], "{what}");
}

/// A WRITE FIRST is accepted; the MR goes and its key is re-issued to `victim_pd`'s MR; the
/// WRITE MIDDLE and LAST that follow must not land anywhere.
fn stale_write(victim_in_other_pd: bool) {
    let (mut p, a, b) = setup();
    write_first(&mut p, &a, &b);
    assert_eq!(
        b.mem.to_vec(0, MTU),
        vec![0x5a; MTU],
        "the FIRST was placed"
    );

    let pd = if victim_in_other_pd {
        p.node(1).dev.alloc_pd().unwrap()
    } else {
        b.pd
    };
    let victim = HeapMemory::shared(4 * MTU);
    recycle_key_to(&mut p, &b, pd, victim.clone());

    write_rest(&mut p, &a, &b, &[(0x07, 1), (0x08, 2)]);
    assert_untouched(
        &victim,
        "no byte of the stale WRITE reached the MR that now has its key",
    );
    assert_eq!(
        p.naks(1),
        vec![(a.sq_psn.add(1), NAK_REMOTE_ACCESS)],
        "the MIDDLE is refused with a remote access NAK"
    );
    assert_eq!(p.qp_state(1, &b), QpState::Err);
    assert_eq!(
        p.node(1).dev.poll_event(),
        Some(AsyncEvent::QpAccessError(b.qpn))
    );
}

#[test]
fn stale_write_never_reaches_another_pds_mr_with_the_same_key() {
    stale_write(true);
}

#[test]
fn stale_write_never_reaches_a_later_registration_in_the_same_pd() {
    stale_write(false);
}

/// Fills B's MR with 0x11 and delivers a READ of `len` bytes of it from A, unanswered yet.
fn read_from_b(p: &mut Pair, a: &Endpoint, b: &Endpoint, len: u32) {
    b.mem.fill(0x11);
    let mut t = TransportRepr::new(BthRepr::new(Opcode(0x0c), b.qpn, a.sq_psn));
    t.ext.reth = Some(RethRepr {
        va: b.addr,
        rkey: b.rkey,
        len,
    });
    let f = p.craft(0, t, &[]);
    p.inject(1, &f);
}

/// A READ is being answered packet by packet; between two reply packets the MR goes and its
/// key is re-issued to another PD's MR full of secrets: the reply must stop with a NAK, never
/// carry the victim's bytes.
#[test]
fn stale_read_reply_never_carries_another_pds_memory() {
    let (mut p, a, b) = setup();
    read_from_b(&mut p, &a, &b, 3 * MTU as u32);

    // The first reply packet comes from B's MR.
    let mut tx = Transmit::default();
    let dev = &mut p.node(1).dev;
    assert!(dev.poll_transmit(0, &mut tx));
    assert_eq!(tx.transport.bth.opcode, Opcode(0x0d), "READ RESPONSE FIRST");
    let mut buf = vec![0u8; tx.payload.len()];
    dev.gather(&tx, &mut buf, None).unwrap();
    assert_eq!(buf, vec![0x11; MTU]);

    let pd = dev.alloc_pd().unwrap();
    let victim = HeapMemory::shared(4 * MTU);
    victim.fill(0xee);
    recycle_key_to(&mut p, &b, pd, victim);

    let dev = &mut p.node(1).dev;
    let mut sent = Vec::new();
    while dev.poll_transmit(0, &mut tx) {
        let mut buf = vec![0u8; tx.payload.len()];
        // A payload segment that no longer resolves fails to gather; one that resolves must
        // not be the victim's.
        if dev.gather(&tx, &mut buf, None).is_ok() {
            assert!(
                !buf.contains(&0xee),
                "a READ reply carried the victim's memory"
            );
        }
        sent.push((tx.transport.bth.opcode, tx.transport.ext.aeth));
    }
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, Opcode::RC_ACK);
    assert_eq!(
        sent[0].1.map(|a| a.syndrome),
        Some(NAK_REMOTE_ACCESS),
        "the reply ends with a remote access NAK"
    );
    assert_eq!(p.qp_state(1, &b), QpState::Err);
}

/// A payload segment refers to one registration: once the key is re-issued, gathering it
/// fails instead of reading the new MR.
#[test]
fn payload_segments_do_not_follow_a_reused_key() {
    let (mut p, a, b) = setup();
    read_from_b(&mut p, &a, &b, MTU as u32);
    let mut tx = Transmit::default();
    assert!(p.node(1).dev.poll_transmit(0, &mut tx));
    let pd = p.node(1).dev.alloc_pd().unwrap();
    let victim = HeapMemory::shared(4 * MTU);
    victim.fill(0xee);
    recycle_key_to(&mut p, &b, pd, victim);
    let mut buf = vec![0u8; tx.payload.len()];
    assert!(
        p.node(1).dev.gather(&tx, &mut buf, None).is_err(),
        "the segment's registration is gone"
    );
    assert!(!buf.contains(&0xee));
}

/// `post_send` with an inline SGE copies the bytes at post time: the lkey must be of the QP's
/// own PD, like any local access.
#[test]
fn inline_sge_of_another_pd_is_refused() {
    let mut p = Pair::lossless();
    let o = ConnectOpts {
        max_inline: 64,
        ..Default::default()
    };
    let (a, _b) = connect(&mut p, &o);
    let dev = &mut p.node(0).dev;
    let other_pd = dev.alloc_pd().unwrap();
    let secret = HeapMemory::shared(64);
    secret.fill(0xee);
    let (lkey, _) = dev
        .reg_mr(other_pd, secret, 0, 0x7000, 64, Access::LOCAL_WRITE)
        .unwrap();
    let sge = Sge {
        addr: 0x7000,
        length: 16,
        lkey,
    };
    let r = dev.post_send(
        a.qpn,
        &SendWr {
            wr_id: 1,
            op: WrOp::Send,
            sg_list: &[sge],
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: None,
        },
    );
    assert!(
        matches!(r, Err(roce::engine::VerbsError::InvalidArgument(_))),
        "{r:?}"
    );
    // The own PD's MR works.
    let own = Sge {
        addr: a.addr,
        length: 16,
        lkey: a.lkey,
    };
    dev.post_send(
        a.qpn,
        &SendWr {
            wr_id: 2,
            op: WrOp::Send,
            sg_list: &[own],
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: None,
        },
    )
    .unwrap();
}

/// A new translation for B's MR: `length` bytes of `mem` from `mem_offset`, at B's address.
fn moved_to(
    mem: &Arc<HeapMemory>,
    mem_offset: usize,
    b: &Endpoint,
    length: usize,
) -> Option<roce::engine::MrTranslation> {
    Some(roce::engine::MrTranslation {
        mem: mem.clone(),
        mem_offset,
        addr: b.addr,
        length: length as u64,
    })
}

/// `rereg_mr` keeps the keys (as mlx5 does) but is a new registration: a WRITE in progress
/// against the old translation is cut off, and later WRITEs with the same rkey land in the
/// new memory.
#[test]
fn rereg_keeps_the_keys_and_cuts_off_the_old_translation() {
    use roce::engine::MrChange;
    let (mut p, a, b) = setup();
    write_first(&mut p, &a, &b);
    let fresh = HeapMemory::shared(4 * MTU);
    let change = MrChange {
        translation: moved_to(&fresh, 0, &b, 4 * MTU),
        ..Default::default()
    };
    let keys = p.node(1).dev.rereg_mr(b.lkey, change).unwrap();
    assert_eq!(keys, (b.lkey, Some(b.rkey)), "the keys stay");
    write_rest(&mut p, &a, &b, &[(0x07, 1)]);
    assert_untouched(&fresh, "not the new memory");
    assert_eq!(b.mem.to_vec(MTU, MTU), vec![0; MTU], "nor the old one");
    assert_eq!(p.naks(1), vec![(a.sq_psn.add(1), NAK_REMOTE_ACCESS)]);

    // A new connection: WRITEs with the same rkey reach the new translation.
    let (mut p, a, b) = setup();
    let fresh = HeapMemory::shared(4 * MTU);
    let dev = &mut p.node(1).dev;
    let pd2 = dev.alloc_pd().unwrap();
    // Another PD: the QP's accesses fail; back to its own PD with new access: they work.
    dev.rereg_mr(
        b.lkey,
        MrChange {
            pd: Some(pd2),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        p.write_status(&a, b.addr, b.rkey, &[0x77; 64]),
        WcStatus::RemAccessErr,
        "the MR left the QP's PD"
    );
    let (mut p, a, b) = setup();
    let change = MrChange {
        translation: moved_to(&fresh, MTU, &b, MTU),
        access: Some(Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        pd: None,
    };
    p.node(1).dev.rereg_mr(b.lkey, change).unwrap();
    assert_eq!(
        p.write_status(&a, b.addr + 8, b.rkey, &[0x77; 64]),
        WcStatus::Success
    );
    assert_eq!(fresh.to_vec(MTU + 8, 64), vec![0x77; 64]);
    assert_eq!(b.mem.to_vec(8, 64), vec![0; 64]);
}

/// Nothing a client or a peer repeats grows the device's QP timer heap without bound. A QP
/// waits hours for an ACK (timeout 31) and keeps the earliest entry; behind it, QPs created,
/// sending and destroyed, and a QP reset and brought up again to send, 2000 times, used to
/// leave one stale entry each.
#[test]
fn the_timer_heap_stays_bounded_under_qp_churn_and_resets() {
    use roce::engine::QpInit;
    use roce::sim::{bring_up, node_gid};
    let o = ConnectOpts {
        timeout: 31,
        ..Default::default()
    };
    let cfg = DeviceConfig::default();
    let mut p = Pair::new(cfg.clone(), cfg, LinkConfig::lossless(10, 1_000), 1);
    let (a, b) = connect(&mut p, &o);
    // Nothing is answered: every QP's ACK timer stays armed.
    p.drop_if = Some(Box::new(|_, _| true));
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    p.run(p.now + 10_000, |_| false);
    let again = p.a.dev.create_qp(&QpInit::rc(a.pd, a.cq)).unwrap();
    for i in 0..2000u64 {
        let qpn = if i % 2 == 0 {
            p.a.dev.create_qp(&QpInit::rc(a.pd, a.cq)).unwrap()
        } else {
            let reset = QpAttr {
                state: Some(QpState::Reset),
                ..Default::default()
            };
            p.a.dev.modify_qp(again, &reset).unwrap();
            again
        };
        let e = Endpoint { qpn, ..a.clone() };
        // Later deadlines than the first QP's: each QP is brought up a little later.
        bring_up(&mut p.a.dev, &e, b.qpn, node_gid(1), &o, 0, 0);
        p.post(0, &e, i, b.write_to(0), &[e.sge(0, 64)]);
        p.run(p.now + 1_000, |_| false);
        if qpn != again {
            p.a.dev.destroy_qp(qpn).unwrap();
        }
        p.a.dev.poll_timeout();
    }
    let n = p.a.dev.timer_entries();
    assert!(n <= 2 * 3 + 64 + 1, "{n} timer entries for 3 live QPs");
}
