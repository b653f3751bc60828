//! Two ferroce RNICs in one process, joined by an in-process DPDK ring pair, driven through the
//! verbs API over the host-interface rings: every RC opcode, UC and UD, data verified.

use dataplane::runtime::{test_config, Runtime};
use ferroce_tests::{loopback_pair, post_recv_one, post_signaled, post_write_at, wait_cq, Side};
use roce::verbs::*;

fn pair(mtu: u32, qp_type: QpType, len: usize) -> (Runtime, Side, Side) {
    let configs = (test_config(3, mtu), test_config(4, mtu));
    loopback_pair("ferroce-tests", configs, qp_type, len, (0x100, 0x200))
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(seed) as u8 ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn rc_every_opcode_between_two_rnics() {
    for mtu in [256u32, 1024, 4096] {
        let (rt, mut a, mut b) = pair(mtu, QpType::Rc, 4 << 20);
        let sizes = [1usize, 100, 4096, 5000, 65536, 1 << 20];
        let mut off = 0u64;
        for (i, &len) in sizes.iter().enumerate() {
            let data = pattern(i as u32, len);
            a.buf.write(off as usize, &data);
            // WRITE A -> B at the same offset.
            post_write_at(&mut a, &b, i as u64, off, len as u32);
            off += len as u64;
        }
        let c = wait_cq(&mut a, sizes.len(), 20);
        assert_eq!(c.len(), sizes.len(), "mtu {mtu}: {c:?}");
        assert!(c.iter().all(|c| c.status == WcStatus::Success));
        let mut off = 0;
        for (i, &len) in sizes.iter().enumerate() {
            assert_eq!(
                b.buf.to_vec(off, len),
                pattern(i as u32, len),
                "mtu {mtu} size {len}"
            );
            off += len;
        }
        // READ back into A at 2 MiB, SEND with immediate, WRITE with immediate, atomics.
        let base = 2 << 20;
        post_signaled(
            &mut a,
            100,
            WrOp::Read {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey.unwrap(),
            },
            base,
            70000,
        );
        post_recv_one(&mut b, 7, 3 << 20, 8192);
        post_recv_one(&mut b, 8, 3 << 20, 0);
        post_signaled(&mut a, 101, WrOp::SendWithImm { imm: 0xbeef }, 0, 5000);
        post_signaled(
            &mut a,
            102,
            WrOp::WriteWithImm {
                remote_addr: b.mr.addr + (3 << 20) + 65536,
                rkey: b.mr.rkey.unwrap(),
                imm: 5,
            },
            0,
            300,
        );
        b.buf.write((4 << 20) - 64, &41u64.to_ne_bytes());
        post_signaled(
            &mut a,
            103,
            WrOp::FetchAdd {
                remote_addr: b.mr.addr + (4 << 20) - 64,
                rkey: b.mr.rkey.unwrap(),
                add: 1,
            },
            base + 100_000,
            8,
        );
        post_signaled(
            &mut a,
            104,
            WrOp::CompareSwap {
                remote_addr: b.mr.addr + (4 << 20) - 64,
                rkey: b.mr.rkey.unwrap(),
                compare: 42,
                swap: 7,
            },
            base + 100_008,
            8,
        );
        let c = wait_cq(&mut a, 5, 20);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![
                (100, WcStatus::Success),
                (101, WcStatus::Success),
                (102, WcStatus::Success),
                (103, WcStatus::Success),
                (104, WcStatus::Success)
            ]
        );
        assert_eq!(a.buf.to_vec(base as usize, 70000), b.buf.to_vec(0, 70000));
        assert_eq!(
            a.buf.to_vec(base as usize + 100_000, 8),
            41u64.to_ne_bytes()
        );
        assert_eq!(
            a.buf.to_vec(base as usize + 100_008, 8),
            42u64.to_ne_bytes()
        );
        assert_eq!(b.buf.to_vec((4 << 20) - 64, 8), 7u64.to_ne_bytes());
        let r = wait_cq(&mut b, 2, 20);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].wr_id, r[0].byte_len, r[0].imm_data),
            (7, 5000, 0xbeef)
        );
        assert_eq!(
            (r[1].wr_id, r[1].opcode, r[1].byte_len, r[1].imm_data),
            (8, WcOpcode::RecvRdmaWithImm, 300, 5)
        );
        assert_eq!(b.buf.to_vec(3 << 20, 5000), a.buf.to_vec(0, 5000));
        let snaps = rt.stop();
        assert!(snaps[0].nic.tx_roce > 0 && snaps[1].nic.rx_roce > 0);
        assert_eq!(snaps[0].dev.rx_icrc_encapsulated, 0);
    }
}
