//! Two ports joined back to back in one process: a pair of `rte_ring`s crossed between two
//! `net_ring` ports (as `rte_eth_from_rings` does), for tests and the loopback demo. What one
//! port transmits on queue `q` the other receives on queue `q`.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::eal::{self, Eal};
use crate::error::{Error, Result};
use crate::ethdev::{Origin, Port, PortConfig};
use crate::mempool::Mempool;
use crate::sys;

/// Ring names are limited to `RTE_RING_NAMESIZE` (incl. the "RG_" memzone prefix).
const MAX_LINK_NAME: usize = 16;

/// Rings shared by the two ports of a link; freed after both ports are closed.
struct Rings(Vec<NonNull<sys::rte_ring>>);

// SAFETY: rte_ring is a lock-free multi-thread structure; we only free it at the end.
unsafe impl Send for Rings {}
// SAFETY: see Send.
unsafe impl Sync for Rings {}

impl Drop for Rings {
    fn drop(&mut self) {
        for r in &self.0 {
            // Frames sent but never received are still mbufs in the ring: free them, or they
            // would leak from their pool.
            let mut objs = [std::ptr::null_mut(); 32];
            loop {
                // SAFETY: both ports using the ring are closed (they held this value alive),
                // so we are its only user; the ring holds rte_mbuf pointers.
                let n = unsafe {
                    sys::ferroce_ring_dequeue_burst(
                        r.as_ptr(),
                        objs.as_mut_ptr(),
                        objs.len() as u32,
                        std::ptr::null_mut(),
                    )
                };
                if n == 0 {
                    break;
                }
                for &m in &objs[..n as usize] {
                    // SAFETY: each dequeued object is an mbuf whose ownership the sending
                    // port passed to the ring.
                    unsafe { sys::ferroce_pktmbuf_free(m as *mut sys::rte_mbuf) };
                }
            }
            // SAFETY: empty and unused (see above).
            unsafe { sys::rte_ring_free(r.as_ptr()) };
        }
    }
}

/// Creates two started ports `(a, b)` joined back to back, named `net_ring_<name>a` and
/// `net_ring_<name>b`, each with `config.rx_queues` queue pairs and receive mbufs from
/// `pool`. Ring size: `config.rx_desc` rounded up to a power of two.
pub fn ring_pair(name: &str, config: &PortConfig, pool: Arc<Mempool>) -> Result<(Port, Port)> {
    Eal::require()?;
    if name.is_empty()
        || name.len() > MAX_LINK_NAME
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(Error::InvalidArgument(format!(
            "ring pair name {name:?} must be 1..={MAX_LINK_NAME} characters [A-Za-z0-9_]"
        )));
    }
    let queues = config.rx_queues.max(config.tx_queues).max(1);
    let size = (config.rx_desc.max(2) as u32).next_power_of_two();
    let _g = eal::control_lock();
    // a_to_b[q] carries a's tx queue q to b's rx queue q, and b_to_a the other way.
    let mut rings = Rings(Vec::new());
    for dir in ["ab", "ba"] {
        for q in 0..queues {
            let rname = CString::new(format!("{name}{dir}{q}")).expect("checked name");
            // SAFETY: valid C string; flags make it single-producer/single-consumer, which is
            // what one tx queue and one rx queue need.
            let r = unsafe {
                sys::rte_ring_create(
                    rname.as_ptr(),
                    size,
                    -1,
                    sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ,
                )
            };
            match NonNull::new(r) {
                Some(r) => rings.0.push(r),
                None => return Err(Error::last("rte_ring_create")),
            }
        }
    }
    let q = queues as usize;
    let ab: Vec<*mut sys::rte_ring> = rings.0[..q].iter().map(|r| r.as_ptr()).collect();
    let ba: Vec<*mut sys::rte_ring> = rings.0[q..].iter().map(|r| r.as_ptr()).collect();
    let rings = Arc::new(rings);
    let mut made = Vec::new();
    for (side, rx, tx) in [("a", &ba, &ab), ("b", &ab, &ba)] {
        let pname = format!("{name}{side}");
        let cname = CString::new(pname.as_str()).expect("checked name");
        // SAFETY: valid C string and arrays of `queues` live rings.
        let id = unsafe {
            sys::rte_eth_from_rings(
                cname.as_ptr(),
                rx.as_ptr(),
                queues as u32,
                tx.as_ptr(),
                queues as u32,
                0,
            )
        };
        if id < 0 {
            for (id, dev) in made.drain(..) {
                let dev: String = dev;
                // SAFETY: a port we created above and never started.
                unsafe { sys::rte_eth_dev_close(id) };
                let c = CString::new(dev).expect("checked");
                // SAFETY: the device's port is closed.
                unsafe { sys::rte_vdev_uninit(c.as_ptr()) };
            }
            return Err(Error::last("rte_eth_from_rings"));
        }
        made.push((id as u16, format!("net_ring_{pname}")));
    }
    drop(_g);
    let mut ports = Vec::new();
    for (id, dev) in made {
        let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(rings.clone());
        ports.push(Port::setup(
            id,
            &dev,
            Origin::Vdev(dev.clone()),
            config,
            pool.clone(),
            Some(keep),
        )?);
    }
    let b = ports.pop().expect("two ports");
    let a = ports.pop().expect("two ports");
    Ok((a, b))
}
