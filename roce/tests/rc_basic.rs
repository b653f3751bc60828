use std::collections::VecDeque;

use roce::memory::Memory;
use roce::sim::{connect, drain_cq, ConnectOpts, Pair};
use roce::verbs::*;

#[test]
fn rc_write_read_send_atomic_smoke() {
    let mut p = Pair::lossless();
    let o = ConnectOpts::default();
    let (a, b) = connect(&mut p, &o);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    a.mem.write(0, &data).unwrap();
    // WRITE 5000 bytes A -> B
    p.a.dev
        .post_send(
            a.qpn,
            &SendWr {
                wr_id: 1,
                op: b.write_to(100),
                sg_list: &[Sge {
                    addr: a.addr,
                    length: 5000,
                    lkey: a.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    // SEND 3000 bytes A -> B
    p.b.dev
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 77,
                sg_list: &[Sge {
                    addr: b.addr + 8192,
                    length: 4096,
                    lkey: b.lkey,
                }],
            },
        )
        .unwrap();
    p.a.dev
        .post_send(
            a.qpn,
            &SendWr {
                wr_id: 2,
                op: WrOp::SendWithImm { imm: 0xabcd },
                sg_list: &[Sge {
                    addr: a.addr,
                    length: 3000,
                    lkey: a.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    // READ back 5000 bytes from B into A at 20000
    p.a.dev
        .post_send(
            a.qpn,
            &SendWr {
                wr_id: 3,
                op: b.read_from(100),
                sg_list: &[Sge {
                    addr: a.addr + 20000,
                    length: 5000,
                    lkey: a.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    // FETCH_ADD on B at 64k
    b.mem.write(65536, &40u64.to_ne_bytes()).unwrap();
    p.a.dev
        .post_send(
            a.qpn,
            &SendWr {
                wr_id: 4,
                op: WrOp::FetchAdd {
                    remote_addr: b.addr + 65536,
                    rkey: b.rkey,
                    add: 2,
                },
                sg_list: &[Sge {
                    addr: a.addr + 40000,
                    length: 8,
                    lkey: a.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    assert!(p.run_until_idle(1_000_000_000));
    let mut ca = VecDeque::new();
    drain_cq(&mut p.a.dev, a.cq, &mut ca);
    let mut cb = VecDeque::new();
    drain_cq(&mut p.b.dev, b.cq, &mut cb);
    eprintln!("{ca:?}\n{cb:?}");
    assert_eq!(ca.len(), 4);
    assert!(ca.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        ca.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(b.mem.to_vec(100, 5000), data);
    assert_eq!(cb.len(), 1);
    assert_eq!(cb[0].byte_len, 3000);
    assert_eq!(cb[0].imm_data, 0xabcd);
    assert_eq!(b.mem.to_vec(8192, 3000), data[..3000]);
    assert_eq!(a.mem.to_vec(20000, 5000), data);
    assert_eq!(a.mem.to_vec(40000, 8), 40u64.to_ne_bytes());
    assert_eq!(b.mem.to_vec(65536, 8), 42u64.to_ne_bytes());
}
