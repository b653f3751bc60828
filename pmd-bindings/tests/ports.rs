//! Integration tests of the DPDK wrappers against real virtual devices.
//!
//! One EAL per test process (DPDK allows one init per process): every test calls `eal()`,
//! which initialises it once; each test then hot-plugs its own uniquely named vdevs and pools,
//! so the tests also run in parallel threads of one process (`cargo test`) or one process
//! each (`cargo nextest`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pmd_bindings::mempool::ROCE_4K_DATA_ROOM;
use pmd_bindings::{ring_pair, Eal, EalBuilder, Error, ExtBuf, Mbuf, Mempool, Port, PortConfig};

fn eal() -> &'static Eal {
    static INIT: OnceLock<&'static Eal> = OnceLock::new();
    INIT.get_or_init(|| {
        EalBuilder::software("pmd-bindings-test")
            .floating_lcores(2)
            .init()
            .expect("EAL init")
    })
}

fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{tag}{}", N.fetch_add(1, Ordering::Relaxed))
}

fn pool(tag: &str, n: u32, room: u16) -> Arc<Mempool> {
    eal();
    let room = if room == 0 {
        pmd_bindings::mempool::DEFAULT_DATA_ROOM
    } else {
        room
    };
    Mempool::new(&unique(tag), n, 0, room).expect("mempool")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferroce-{}-{}", unique(tag), std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Minimal classic-pcap writer (microsecond timestamps, Ethernet link type).
fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    std::fs::write(path, out).unwrap();
}

/// Reads the frames of a classic pcap (either timestamp resolution, little-endian).
fn read_pcap(path: &std::path::Path) -> Vec<Vec<u8>> {
    let data = std::fs::read(path).unwrap();
    let magic = u32::from_le_bytes(data[0..4].try_into().unwrap());
    assert!(
        magic == 0xa1b2c3d4 || magic == 0xa1b23c4d,
        "pcap magic {magic:x}"
    );
    let mut off = 24;
    let mut frames = Vec::new();
    while off + 16 <= data.len() {
        let caplen = u32::from_le_bytes(data[off + 8..off + 12].try_into().unwrap()) as usize;
        off += 16;
        frames.push(data[off..off + caplen].to_vec());
        off += caplen;
    }
    frames
}

/// A frame of `len` bytes: broadcast Ethernet header, then a counter pattern.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0x99, 0, seed]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental EtherType
    for (i, b) in f.iter_mut().enumerate().skip(14) {
        *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
    }
    f
}

fn mbuf_from(pool: &Mempool, bytes: &[u8]) -> Mbuf {
    let mut m = pool.alloc().expect("alloc");
    assert!(m.extend_from_slice(bytes), "frame fits one mbuf");
    m
}

/// Polls `rx` until `n` mbufs arrived or a second passed.
fn receive(rx: &mut pmd_bindings::RxQueue, n: usize) -> Vec<Mbuf> {
    let mut got = Vec::with_capacity(n.max(32));
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < n && Instant::now() < deadline {
        if got.capacity() - got.len() < 32 {
            got.reserve(32);
        }
        if rx.rx_burst(&mut got) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    got
}

#[test]
fn second_eal_init_is_a_typed_error() {
    eal();
    let err = EalBuilder::software("again").init().unwrap_err();
    assert_eq!(err, Error::AlreadyInitialized);
    assert!(eal().runtime_dir().is_some());
    assert!(pmd_bindings::dpdk_version().contains("22.11"));
}

#[test]
fn pcap_rx_to_tx_is_byte_identical() {
    let dir = tmpdir("pcap");
    let (inp, outp) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let frames: Vec<Vec<u8>> = (0..50)
        .map(|i| frame(60 + i * 29 % 1400, i as u8))
        .collect();
    write_pcap(&inp, &frames);
    let pool = pool("pcap", 512, 0);
    let baseline = pool.in_use();
    {
        let devargs = format!(
            "net_pcap{},rx_pcap={},tx_pcap={}",
            unique("t"),
            inp.display(),
            outp.display()
        );
        let port = Port::probe(&devargs, &PortConfig::default(), pool.clone()).expect("probe");
        let mut rx = port.rx_queue(0).unwrap();
        let mut tx = port.tx_queue(0).unwrap();
        let mut got = receive(&mut rx, frames.len());
        assert_eq!(got.len(), frames.len());
        for (m, f) in got.iter().zip(&frames) {
            assert_eq!(m.data(), &f[..]);
        }
        while !got.is_empty() {
            tx.tx_burst(&mut got);
        }
        let stats = port.stats().unwrap();
        assert_eq!(stats.ipackets, frames.len() as u64);
        assert_eq!(stats.opackets, frames.len() as u64);
        // Dropping the port stops and closes it, which flushes the tx pcap.
    }
    assert_eq!(read_pcap(&outp), frames);
    assert_eq!(pool.in_use(), baseline, "mbufs leaked");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn ring_pair_carries_frames_both_ways() {
    let pool = pool("rp", 1024, 0);
    let baseline = pool.in_use();
    {
        let (a, b) = ring_pair(&unique("rp"), &PortConfig::default(), pool.clone()).unwrap();
        let (mut atx, mut arx) = (a.tx_queue(0).unwrap(), a.rx_queue(0).unwrap());
        let (mut btx, mut brx) = (b.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
        let sent: Vec<Vec<u8>> = (0..100).map(|i| frame(64 + i, i as u8)).collect();
        let mut burst: Vec<Mbuf> = sent.iter().map(|f| mbuf_from(&pool, f)).collect();
        assert_eq!(atx.tx_burst(&mut burst), 100);
        assert!(burst.is_empty());
        let got = receive(&mut brx, 100);
        assert_eq!(
            got.iter().map(|m| m.to_vec()).collect::<Vec<_>>(),
            sent,
            "a -> b"
        );
        drop(got);
        btx.tx_one(mbuf_from(&pool, &sent[3])).unwrap();
        let back = receive(&mut arx, 1);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].data(), &sent[3][..]);
        assert!(a.link().unwrap().up);
        // A queue can only be owned once.
        assert!(a.rx_queue(0).is_err());
        assert!(a.rx_queue(7).is_err());
    }
    assert_eq!(pool.in_use(), baseline, "mbufs leaked");
}

#[test]
fn tx_burst_hands_back_what_the_driver_did_not_take() {
    let pool = pool("full", 256, 0);
    let baseline = pool.in_use();
    {
        let cfg = PortConfig {
            rx_desc: 16,
            tx_desc: 16,
            ..PortConfig::default()
        };
        let (a, _b) = ring_pair(&unique("full"), &cfg, pool.clone()).unwrap();
        let mut tx = a.tx_queue(0).unwrap();
        let mut burst: Vec<Mbuf> = (0..40).map(|i| mbuf_from(&pool, &frame(64, i))).collect();
        let first_byte = |m: &Mbuf| m.data()[11];
        let sent = tx.tx_burst(&mut burst);
        // The ring holds 15 (size 16 minus one); the rest come back, in order.
        assert!(sent < 40, "ring of 16 took {sent}");
        assert_eq!(burst.len(), 40 - sent);
        assert_eq!(first_byte(&burst[0]), sent as u8);
        // Dropping the leftovers frees them: nothing leaks.
    }
    assert_eq!(pool.in_use(), baseline, "mbufs leaked");
}

#[test]
fn roce_4k_frame_crosses_intact_in_one_segment_and_as_a_chain() {
    let big = pool("big", 256, ROCE_4K_DATA_ROOM);
    let small = pool("small", 256, 0);
    assert!(big.max_frame_len() >= 4200);
    let (bb, sb) = (big.in_use(), small.in_use());
    {
        let cfg = PortConfig {
            mtu: Some(4200),
            ..PortConfig::default()
        };
        let (a, b) = ring_pair(&unique("big"), &cfg, big.clone()).unwrap();
        let mut tx = a.tx_queue(0).unwrap();
        let mut rx = b.rx_queue(0).unwrap();
        let f = frame(4210, 9);
        tx.tx_one(mbuf_from(&big, &f)).unwrap();
        // The same frame as a chain of three small segments.
        let mut head = mbuf_from(&small, &f[..1500]);
        head.chain(mbuf_from(&small, &f[1500..3000])).unwrap();
        head.chain(mbuf_from(&small, &f[3000..])).unwrap();
        assert_eq!(head.nb_segs(), 3);
        assert_eq!(head.pkt_len(), f.len());
        assert_eq!(head.segments().count(), 3);
        tx.tx_one(head).unwrap();
        let got = receive(&mut rx, 2);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].data(), &f[..]);
        assert_eq!(got[1].to_vec(), f);
    }
    assert_eq!(big.in_use(), bb);
    assert_eq!(small.in_use(), sb);
}

#[test]
fn bad_devargs_are_clear_errors() {
    let pool = pool("bad", 64, 0);
    let cfg = PortConfig::default();
    let e = Port::probe("net_nosuchdriver0", &cfg, pool.clone()).unwrap_err();
    assert!(e.to_string().contains("net_nosuchdriver0"), "{e}");
    let e = Port::probe(
        &format!("net_pcap{},rx_pcap=/nonexistent/x.pcap", unique("b")),
        &cfg,
        pool.clone(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Dpdk {
                op: "rte_dev_probe",
                ..
            }
        ),
        "{e}"
    );
    let e = Port::probe("", &cfg, pool.clone()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = Port::open("0000:ff:1f.7", &cfg, pool.clone()).unwrap_err();
    assert!(e.to_string().contains("0000:ff:1f.7"), "{e}");
    let e = Mempool::new(&"x".repeat(64), 64, 0, ROCE_4K_DATA_ROOM).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)));
    // The failed probe left nothing behind: the same name can be probed properly.
    let name = format!("net_ring{}", unique("again"));
    let p = Port::probe(&name, &cfg, pool.clone()).unwrap();
    drop(p);
    let p = Port::probe(&name, &cfg, pool.clone()).expect("re-probe after removal");
    drop(p);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn pool_exhaustion_is_an_error_and_bulk_alloc_is_all_or_nothing() {
    let pool = pool("exh", 8, 0);
    let mut v = Vec::new();
    pool.alloc_bulk(&mut v, 8).unwrap();
    assert!(matches!(pool.alloc(), Err(Error::PoolExhausted(_))));
    let mut w = Vec::new();
    assert!(pool.alloc_bulk(&mut w, 1).is_err());
    assert!(w.is_empty());
    assert_eq!(pool.in_use(), 8);
    v.clear();
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn mbuf_edits_respect_room() {
    let pool = pool("edit", 8, 0);
    let mut m = pool.alloc().unwrap();
    let room = m.tailroom();
    assert!(m.append(room + 1).is_none());
    m.append(10).unwrap().copy_from_slice(&[1; 10]);
    m.prepend(4).unwrap().copy_from_slice(&[2; 4]);
    assert_eq!(m.data(), &[2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    assert!(m.adj(2));
    assert!(m.trim(3));
    assert_eq!(m.data(), &[2, 2, 1, 1, 1, 1, 1, 1, 1]);
    assert!(!m.adj(100));
    assert!(!m.trim(100));
    assert!(m.prepend(m.headroom() + 1).is_none());
    m.data_mut()[0] = 9;
    assert_eq!(m.data()[0], 9);
}

#[test]
fn external_buffer_is_released_after_the_last_mbuf() {
    let pool = pool("ext", 64, 0);
    let released = Arc::new(AtomicU32::new(0));
    let payload: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let (a, b) = ring_pair(&unique("ext"), &PortConfig::default(), pool.clone()).unwrap();
    let mut tx = a.tx_queue(0).unwrap();
    let mut rx = b.rx_queue(0).unwrap();
    {
        let mut owned = payload.clone().into_boxed_slice();
        let addr = owned.as_mut_ptr();
        let r = released.clone();
        // SAFETY: `owned` moves into the release closure and is untouched until it runs.
        let ext = unsafe {
            ExtBuf::from_raw_parts(
                addr,
                payload.len(),
                Box::new(move || {
                    drop(owned);
                    r.fetch_add(1, Ordering::SeqCst);
                }),
            )
        };
        let mut m1 = pool.alloc().unwrap();
        m1.attach_extbuf(&ext, 0, 1000).unwrap();
        let mut m2 = pool.alloc().unwrap();
        m2.attach_extbuf(&ext, 1000, 2000).unwrap();
        assert!(m2.attach_extbuf(&ext, 0, 1).is_err(), "not empty any more");
        let mut m3 = pool.alloc().unwrap();
        assert!(m3.attach_extbuf(&ext, 2999, 2).is_err(), "out of bounds");
        assert_eq!(ext.refcnt(), 3);
        assert_eq!(m2.data(), &payload[1000..3000]);
        tx.tx_one(m1).unwrap();
        tx.tx_one(m2).unwrap();
        drop(ext);
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "mbufs still reference it"
        );
    }
    let got = receive(&mut rx, 2);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].data(), &payload[..1000]);
    assert_eq!(got[1].data(), &payload[1000..]);
    assert_eq!(released.load(Ordering::SeqCst), 0);
    drop(got);
    assert_eq!(released.load(Ordering::SeqCst), 1);
    let ext = ExtBuf::from_vec(vec![7; 100]);
    let mut m = pool.alloc().unwrap();
    m.attach_extbuf(&ext, 10, 20).unwrap();
    assert_eq!(m.data(), &[7; 20]);
    drop(ext);
    assert_eq!(m.data(), &[7; 20], "the mbuf keeps the memory alive");
    drop(m);
    drop((tx, rx, a, b));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn closures_run_on_worker_lcores_and_threads_register() {
    let eal = eal();
    let workers = eal.worker_lcores();
    assert_eq!(workers, vec![1]);
    let job = eal
        .launch(1, || pmd_bindings::eal::lcore_id() * 10 + 7)
        .unwrap();
    assert_eq!(job.join().unwrap(), 17);
    let job = eal.launch(1, || -> u32 { panic!("boom") }).unwrap();
    assert!(job.join().is_err(), "the panic is reported, not an abort");
    assert!(eal.launch(99, || ()).is_err());
    let t = std::thread::spawn(|| {
        let reg = Eal::get().unwrap().register_thread().unwrap();
        let id = pmd_bindings::eal::lcore_id();
        drop(reg);
        id
    });
    let id = t.join().unwrap();
    assert!(id < 128 && id != 0 && id != 1, "registered lcore id {id}");
}

#[test]
fn flow_control_on_a_virtual_port_is_not_supported() {
    let pool = pool("pfc", 64, 0);
    let (a, _b) = ring_pair(&unique("pfc"), &PortConfig::default(), pool.clone()).unwrap();
    let pfc = pmd_bindings::PfcSettings {
        priority: 3,
        rx_pause: true,
        tx_pause: true,
        high_water: 1000,
        low_water: 500,
        pause_time: 0xffff,
    };
    assert!(matches!(
        a.set_priority_flow_control(&pfc),
        Err(Error::NotSupported { .. })
    ));
    let bad = pmd_bindings::PfcSettings { priority: 8, ..pfc };
    assert!(matches!(
        a.set_priority_flow_control(&bad),
        Err(Error::InvalidArgument(_))
    ));
    let x = a.xstats().unwrap();
    assert!(x.iter().any(|(n, _)| n == "rx_good_packets"), "{x:?}");
}

/// Warming a pool for a thread writes mbufs and gives every one back, also when the pool
/// has fewer than asked for; the mbufs it hands out next are whole and empty.
#[test]
fn warming_a_pool_gives_every_mbuf_back() {
    let pool = pool("warm", 64, 0);
    let baseline = pool.in_use();
    pool.warm(16);
    assert_eq!(pool.in_use(), baseline, "mbufs kept by warm");
    pool.warm(1000);
    assert_eq!(pool.in_use(), baseline, "mbufs kept when the pool ran out");
    let m = pool.alloc().unwrap();
    assert_eq!(m.data_len(), 0);
    assert_eq!(pool.available(), pool.capacity() - 1);
}
