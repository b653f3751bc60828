//! Completion channels and CQs: create (also `_ex`), poll, notify, resize, destroy, CQ events.

use super::*;

/// A completion channel: an eventfd (semaphore mode: one read per event) and the CQs whose
/// notifications are waiting to be taken by `ibv_get_cq_event`.
#[repr(C)]
pub(crate) struct Channel {
    pub(crate) ibv: sys::ibv_comp_channel,
    pub(crate) fd: OwnedFd,
    pub(crate) ready: Arc<Mutex<VecDeque<usize>>>,
}

/// A CQ: the application's `ibv_cq_ex` first (whose head is an `ibv_cq`, so both views
/// lead here), then the completion the extended poll API is positioned on.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) ex: sys::ibv_cq_ex,
    pub(crate) id: CqId,
    pub(crate) watcher: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// The completion `start_poll`/`next_poll` read last (the `read_*` accessors' source).
    pub(crate) cur: sys::ibv_wc,
    /// Held from a successful `ibv_start_poll` to `ibv_end_poll`: `cur` and the CQ's
    /// `wr_id`/`status` are one per CQ, so two threads polling it with the extended API
    /// take turns, as providers lock their CQ over that span (rxe's cq_start_poll).
    pub(crate) polling: AtomicBool,
    /// Completion events handed out by `ibv_get_cq_event`, acknowledged by
    /// `ibv_ack_cq_events`.
    pub(crate) events: Acks,
    /// Its asynchronous events (CQ_ERR), acknowledged by `ibv_ack_async_event`.
    pub(crate) async_events: Acks,
}

/// Events of an object handed to the application and those it acknowledged: destroying the
/// object waits until they are equal, as rdma-core does (`ibv_destroy_cq`, `_qp`, `_srq`), so
/// no thread still holds an event that points at freed memory.
#[derive(Default)]
pub(crate) struct Acks {
    pub(crate) n: Mutex<(u32, u32)>,
    pub(crate) cv: std::sync::Condvar,
}

impl Acks {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u32, u32)> {
        self.n.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more event handed out.
    pub(crate) fn report(&self) {
        let mut n = self.lock();
        n.0 = n.0.wrapping_add(1);
    }

    /// `k` more acknowledged; `then` sees the acknowledged total. Both, and the wake-up, happen
    /// under the lock: a destroy waiting in [`Acks::wait`] returns (and frees the object) only
    /// after this call has stopped touching it.
    pub(crate) fn ack(&self, k: u32, then: impl FnOnce(u32)) {
        let mut n = self.lock();
        n.1 = n.1.wrapping_add(k);
        then(n.1);
        self.cv.notify_all();
        drop(n);
    }

    /// Waits until every event handed out is acknowledged.
    pub(crate) fn wait(&self) {
        let mut n = self.lock();
        while n.0 != n.1 {
            n = self.cv.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    c: *mut sys::ibv_context,
) -> *mut sys::ibv_comp_channel {
    if ctx_of(c).is_none() {
        return null_errno(libc::EINVAL);
    }
    let Some(fd) = eventfd(libc::EFD_SEMAPHORE) else {
        return null_errno(libc::EMFILE);
    };
    let ch = Box::new(Channel {
        ibv: sys::ibv_comp_channel {
            context: c,
            fd: fd.as_raw_fd(),
            refcnt: 0,
        },
        fd,
        ready: Arc::new(Mutex::new(VecDeque::new())),
    });
    Box::into_raw(ch) as *mut sys::ibv_comp_channel
}
version!(ibv_create_comp_channel, "IBVERBS_1.0");

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut sys::ibv_comp_channel) -> c_int {
    with_obj(ch, |ctx, c: *mut Channel| {
        // The reference count changes under the context's object lock (CQs are created and
        // destroyed on other threads), as under rdma-core's context mutex.
        let objs = objects(ctx);
        if (*ch).refcnt > 0 {
            return libc::EBUSY;
        }
        drop(objs);
        drop(Box::from_raw(c));
        0
    })
}
version!(ibv_destroy_comp_channel, "IBVERBS_1.0");

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    c: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut sys::ibv_cq {
    create_cq(c, cqe, cq_context, channel, comp_vector) as *mut sys::ibv_cq
}
version!(ibv_create_cq, "IBVERBS_1.1");

/// Creates a CQ (both `ibv_create_cq` and `create_cq_ex`; the extended poll functions are
/// always filled in, harmless for a plain CQ).
pub(crate) unsafe fn create_cq(
    c: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut Cq {
    guard(std::ptr::null_mut(), || {
        let Some(ctx) = ctx_of(c) else {
            return null_errno(libc::EINVAL);
        };
        // As the kernel checks: a completion vector the context has (`num_comp_vectors`,
        // 1 here) and no more entries than the device's max_cqe.
        let max_cqe = ctx.limits.limits.max_cqe;
        if cqe < 1
            || cqe as u32 > max_cqe
            || comp_vector < 0
            || comp_vector >= (*c).num_comp_vectors
        {
            explain(&VerbsError::InvalidArgument(format!(
                "ibv_create_cq: cqe {cqe} (1..={max_cqe}), comp_vector {comp_vector} \
                 (below {})",
                (*c).num_comp_vectors
            )));
            return null_errno(libc::EINVAL);
        }
        let mut cl = client(ctx);
        let id = match cl.create_cq(cqe as u32) {
            Ok(id) => id,
            Err(e) => {
                return null_errno(errno_of(&e));
            }
        };
        let notifier = cl.cq_notifier(id);
        drop(cl);
        // SAFETY: zero is a valid ibv_cq_ex (C data; zeroed pthread objects are their
        // static initialisers on glibc).
        let mut ex: sys::ibv_cq_ex = std::mem::zeroed();
        ex.context = c;
        ex.channel = channel;
        ex.cq_context = cq_context;
        ex.handle = id.0;
        ex.cqe = cqe;
        ex.start_poll = Some(cqx_start_poll);
        ex.next_poll = Some(cqx_next_poll);
        ex.end_poll = Some(cqx_end_poll);
        ex.read_opcode = Some(cqx_read_opcode);
        ex.read_vendor_err = Some(cqx_read_vendor_err);
        ex.read_byte_len = Some(cqx_read_byte_len);
        ex.read_imm_data = Some(cqx_read_imm_data);
        ex.read_qp_num = Some(cqx_read_qp_num);
        ex.read_src_qp = Some(cqx_read_src_qp);
        ex.read_wc_flags = Some(cqx_read_wc_flags);
        ex.read_slid = Some(cqx_read_slid);
        ex.read_sl = Some(cqx_read_sl);
        ex.read_dlid_path_bits = Some(cqx_read_dlid_path_bits);
        let cq = Box::into_raw(Box::new(Cq {
            ex,
            id,
            watcher: None,
            cur: std::mem::zeroed(),
            polling: AtomicBool::new(false),
            events: Default::default(),
            async_events: Default::default(),
        }));
        // Undoes the creation when the channel's thread cannot be set up.
        let undo = |cq: *mut Cq, e: c_int| {
            let _ = client(ctx).destroy_cq(id);
            drop(Box::from_raw(cq));
            set_errno(e);
            std::ptr::null_mut()
        };
        if !channel.is_null() {
            // A thread sleeps on the CQ ring's notification futex and turns each notification
            // into one event on the channel.
            let ch = channel as *mut Channel;
            let (ready, fd) = ((*ch).ready.clone(), (*ch).fd.as_raw_fd());
            let stop = Arc::new(AtomicBool::new(false));
            let st = stop.clone();
            let key = cq as usize;
            let Some(n) = notifier else {
                return undo(cq, libc::EINVAL);
            };
            let t = std::thread::Builder::new()
                .name("ibv-cq-event".into())
                .spawn(move || {
                    let mut seen = n.armed_at();
                    while !st.load(Ordering::Acquire) {
                        if n.wait(seen, Duration::from_millis(100)) {
                            seen = n.seq();
                            let _moving = moving_read();
                            ready
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push_back(key);
                            // The channel's eventfd lives until the CQ is destroyed (the
                            // channel cannot be destroyed while a CQ holds a reference), and
                            // this thread is joined then.
                            count_up(fd);
                        }
                    }
                });
            match t {
                Ok(h) => (*cq).watcher = Some((stop, h)),
                Err(_) => return undo(cq, libc::EAGAIN),
            }
        }
        let mut objs = objects(ctx);
        objs.cqs.insert(id.0, cq as usize);
        if !channel.is_null() {
            (*channel).refcnt += 1;
        }
        drop(objs);
        cq
    })
}

/// What `ibv_create_cq_ex` can be asked for: the `read_*` fields ferroce fills in.
pub(crate) const CQ_EX_WC_FLAGS: u64 = (sys::IBV_WC_EX_WITH_BYTE_LEN
    | sys::IBV_WC_EX_WITH_IMM
    | sys::IBV_WC_EX_WITH_QP_NUM
    | sys::IBV_WC_EX_WITH_SRC_QP
    | sys::IBV_WC_EX_WITH_SLID
    | sys::IBV_WC_EX_WITH_SL
    | sys::IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex`): fields beyond [`CQ_EX_WC_FLAGS`]
/// (timestamps, CVLAN, flow tag, tag matching), other comp_mask bits and creation flags
/// are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_cq_ex(
    c: *mut sys::ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut sys::ibv_cq_ex {
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    let a = &*attr;
    if a.wc_flags & !CQ_EX_WC_FLAGS != 0
        || a.comp_mask & !sys::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        || (a.comp_mask & sys::IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags != 0)
    {
        return null_errno(libc::EOPNOTSUPP);
    }
    let Ok(cqe) = c_int::try_from(a.cqe) else {
        return null_errno(libc::EINVAL);
    };
    let Ok(vector) = c_int::try_from(a.comp_vector) else {
        return null_errno(libc::EINVAL);
    };
    create_cq(c, cqe, a.cq_context, a.channel, vector) as *mut sys::ibv_cq_ex
}

/// Polls one completion into the CQ's current entry: 0, ENOENT when empty, or an errno.
pub(crate) unsafe fn cqx_poll_one(cq: *mut sys::ibv_cq_ex) -> c_int {
    let q = cq as *mut Cq;
    match poll_cq(cq as *mut sys::ibv_cq, 1, &mut (*q).cur) {
        1 => {
            (*q).ex.status = (*q).cur.status;
            (*q).ex.wr_id = (*q).cur.wr_id;
            0
        }
        0 => libc::ENOENT,
        e => -e,
    }
}

pub(crate) unsafe extern "C" fn cqx_start_poll(
    cq: *mut sys::ibv_cq_ex,
    attr: *mut sys::ibv_poll_cq_attr,
) -> c_int {
    if cq.is_null() || (!attr.is_null() && (*attr).comp_mask != 0) {
        return libc::EINVAL;
    }
    let lock = &(*(cq as *mut Cq)).polling;
    while lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    let r = cqx_poll_one(cq);
    if r != 0 {
        // Nothing to read (ENOENT) or an error: no ibv_end_poll follows (verbs(7)).
        lock.store(false, Ordering::Release);
    }
    r
}

pub(crate) unsafe extern "C" fn cqx_next_poll(cq: *mut sys::ibv_cq_ex) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    cqx_poll_one(cq)
}

pub(crate) unsafe extern "C" fn cqx_end_poll(cq: *mut sys::ibv_cq_ex) {
    if !cq.is_null() {
        (*(cq as *mut Cq)).polling.store(false, Ordering::Release);
    }
}

pub(crate) unsafe fn cqx_cur<'a>(cq: *mut sys::ibv_cq_ex) -> &'a sys::ibv_wc {
    &(*(cq as *mut Cq)).cur
}

pub(crate) unsafe extern "C" fn cqx_read_opcode(cq: *mut sys::ibv_cq_ex) -> c_uint {
    cqx_cur(cq).opcode
}
pub(crate) unsafe extern "C" fn cqx_read_vendor_err(cq: *mut sys::ibv_cq_ex) -> u32 {
    cqx_cur(cq).vendor_err
}
pub(crate) unsafe extern "C" fn cqx_read_byte_len(cq: *mut sys::ibv_cq_ex) -> u32 {
    cqx_cur(cq).byte_len
}
pub(crate) unsafe extern "C" fn cqx_read_imm_data(cq: *mut sys::ibv_cq_ex) -> u32 {
    cqx_cur(cq).__bindgen_anon_1.imm_data
}
pub(crate) unsafe extern "C" fn cqx_read_qp_num(cq: *mut sys::ibv_cq_ex) -> u32 {
    cqx_cur(cq).qp_num
}
pub(crate) unsafe extern "C" fn cqx_read_src_qp(cq: *mut sys::ibv_cq_ex) -> u32 {
    cqx_cur(cq).src_qp
}
pub(crate) unsafe extern "C" fn cqx_read_wc_flags(cq: *mut sys::ibv_cq_ex) -> c_uint {
    cqx_cur(cq).wc_flags
}
pub(crate) unsafe extern "C" fn cqx_read_slid(cq: *mut sys::ibv_cq_ex) -> u32 {
    cqx_cur(cq).slid as u32
}
pub(crate) unsafe extern "C" fn cqx_read_sl(cq: *mut sys::ibv_cq_ex) -> u8 {
    cqx_cur(cq).sl
}
pub(crate) unsafe extern "C" fn cqx_read_dlid_path_bits(cq: *mut sys::ibv_cq_ex) -> u8 {
    cqx_cur(cq).dlid_path_bits
}

listed!(Cq, sys::ibv_cq, cqs, |q| q.id.0, |c, q| c.destroy_cq(q.id);
    /// Stops the channel's thread; events not yet taken are dropped (`ibv_get_cq_event`
    /// skips their eventfd counts), events already taken must be acknowledged first
    /// (`ibv_ack_cq_events`).
    unsafe fn release(q: *mut Cq, ctx: &Ctx) {
        if let Some((stop, h)) = (*q).watcher.take() {
            stop.store(true, Ordering::Release);
            let _ = h.join();
            let ch = (*q).ex.channel as *mut Channel;
            (*ch)
                .ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|k| *k != q as usize);
            (*q).events.wait();
            let objs = objects(ctx);
            (*ch).ibv.refcnt -= 1;
            drop(objs);
        }
    }
);

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    destroy_acked::<Cq>(cq)
}
version!(ibv_destroy_cq, "IBVERBS_1.1");

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on, keeping those it holds;
/// EINVAL for a size past the device's `max_cqe` or below what it holds.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut sys::ibv_cq, cqe: c_int) -> c_int {
    let Some(ctx) = owner_ctx(cq).filter(|_| cqe >= 1) else {
        return libc::EINVAL;
    };
    let q = cq as *mut Cq;
    status(client(ctx).resize_cq(CqId((*cq).handle), cqe as u32), |n| {
        (*q).ex.cqe = n as c_int;
    })
}
version!(ibv_resize_cq, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut sys::ibv_comp_channel,
    cq: *mut *mut sys::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq.is_null() {
        return neg1_errno(libc::EINVAL);
    }
    let c = ch as *mut Channel;
    loop {
        if !count_down((*c).fd.as_raw_fd()) {
            return -1;
        }
        // Heap writes follow: not while registration moves pages (MOVING); never held
        // across the blocking read above.
        let moving = moving_read();
        let mut ready = (*c).ready.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = ready.pop_front() {
            // Counted while the queue is held, so ibv_destroy_cq (which empties the queue of
            // its CQ's events under this lock, then waits for the counts to match) cannot
            // free the CQ before this event is acknowledged.
            (*(k as *const Cq)).events.report();
            drop(ready);
            drop(moving);
            let q = k as *mut sys::ibv_cq;
            *cq = q;
            if !cq_context.is_null() {
                *cq_context = (*q).cq_context;
            }
            return 0;
        }
        drop(ready);
        drop(moving);
        // An event of a CQ destroyed meanwhile: wait for the next.
    }
}
version!(ibv_get_cq_event, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut sys::ibv_cq, n: c_uint) {
    if cq.is_null() {
        return;
    }
    let _moving = moving_read();
    let q = &*(cq as *const Cq);
    q.events.ack(n, |total| (*cq).comp_events_completed = total);
}
version!(ibv_ack_cq_events, "IBVERBS_1.1");

pub(crate) unsafe extern "C" fn req_notify_cq(
    cq: *mut sys::ibv_cq,
    solicited_only: c_int,
) -> c_int {
    with_obj(cq, |ctx, q: *mut Cq| {
        let mut cl = client(ctx);
        let r = if solicited_only != 0 {
            cl.req_notify_cq_solicited((*q).id)
        } else {
            cl.req_notify_cq((*q).id)
        };
        status(r, |()| ())
    })
}

pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut sys::ibv_cq,
    n: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    let Some(ctx) = owner_ctx(cq).filter(|_| n >= 0 && (n == 0 || !wc.is_null())) else {
        return -libc::EINVAL;
    };
    // Straight into the application's array: no intermediate buffer on a poll.
    let r = client(ctx).poll_cq_slots(CqId((*cq).handle), n as usize, |i, s| {
        // SAFETY: zero is a valid ibv_wc.
        let mut w: sys::ibv_wc = std::mem::zeroed();
        w.wr_id = s.wr_id;
        w.status = s.status;
        w.opcode = s.opcode;
        w.vendor_err = s.vendor_err;
        w.byte_len = s.byte_len;
        // The immediate travels in network order in ibv_wc.
        if s.wc_flags & sys::IBV_WC_WITH_INV != 0 {
            w.__bindgen_anon_1.invalidated_rkey = s.invalidated_rkey;
        } else {
            w.__bindgen_anon_1.imm_data = s.imm_data.to_be();
        }
        w.qp_num = s.qp_num;
        w.src_qp = s.src_qp;
        w.wc_flags = s.wc_flags;
        w.pkey_index = s.pkey_index;
        w.sl = s.sl;
        // SAFETY: the caller's array of n entries; i < n.
        *wc.add(i) = w;
    });
    match r {
        Ok(k) => k as c_int,
        Err(e) => -errno_of(&e),
    }
}
