//! Contexts: opening a device (one rnicd connection each), the async event pump, closing.

use super::*;

/// An open device: the application's `verbs_context` (and `ibv_context` at its end) first.
#[repr(C)]
pub(crate) struct Ctx {
    pub(crate) vctx: sys::verbs_context,
    pub(crate) client: Mutex<RemoteContext>,
    pub(crate) dev: &'static Device,
    /// `context->async_fd`: an eventfd (semaphore mode) counting the events in `events`, so
    /// an application may poll(2) it as it would the kernel's.
    pub(crate) async_fd: OwnedFd,
    /// `context->cmd_fd`: a real descriptor, as programs expect of a context (they dup it,
    /// pass it to another process, fstat it). It is the device's character file where the
    /// device is visible (`ferroce-run --ns`), else /dev/null; nothing is read or written on
    /// it: commands travel on the rnicd connection.
    pub(crate) cmd_fd: OwnedFd,
    pub(crate) limits: roce::engine::DeviceAttr,
    /// Asynchronous events taken from rnicd, waiting for `ibv_get_async_event`.
    pub(crate) events: Mutex<VecDeque<EventSlot>>,
    /// The application's objects by number: async events name their QP, CQ or SRQ.
    pub(crate) objects: Mutex<Objects>,
    /// The thread that moves events from rnicd's ring to `events` and the async fd.
    pub(crate) event_thread: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
}

/// Opens the descriptor a context shows as `cmd_fd`: the device's character file
/// (`ibv_device.dev_path`'s `/dev/infiniband/<dev_name>`) where one exists, else /dev/null.
pub(crate) unsafe fn open_cmd_fd(dev: *mut sys::ibv_device) -> std::io::Result<OwnedFd> {
    let name = CStr::from_ptr((*dev).dev_name.as_ptr()).to_string_lossy();
    let candidates = [
        format!("/dev/infiniband/{name}\0"),
        "/dev/null\0".to_string(),
    ];
    let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
    for p in &candidates {
        let fd = libc::open(p.as_ptr() as *const c_char, libc::O_RDWR | libc::O_CLOEXEC);
        if fd >= 0 {
            return Ok(OwnedFd::from_raw_fd(fd));
        }
        last = std::io::Error::last_os_error();
    }
    Err(last)
}

/// The application's QPs, CQs and SRQs of a context, by number (their addresses).
#[derive(Default)]
pub(crate) struct Objects {
    pub(crate) qps: HashMap<u32, usize>,
    pub(crate) cqs: HashMap<u32, usize>,
    pub(crate) srqs: HashMap<u32, usize>,
}

pub(crate) fn objects(c: &Ctx) -> std::sync::MutexGuard<'_, Objects> {
    c.objects.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes `id` from an object table if it is still `obj` (not a newer object that reused
/// the id); whether it did.
pub(crate) fn unlist(table: &mut HashMap<u32, usize>, id: u32, obj: usize) -> bool {
    if table.get(&id) == Some(&obj) {
        table.remove(&id);
        true
    } else {
        false
    }
}

/// Held for writing while registration moves application pages onto a memfd
/// (`ferroce_host::app::shadow`): a write to those pages between the copy and the remap would be
/// lost, and they may hold this library's own heap objects. The library's background threads
/// (event pump, completion-channel threads) write only while holding it for reading.
pub(crate) static MOVING: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub(crate) fn moving_read() -> std::sync::RwLockReadGuard<'static, ()> {
    MOVING.read().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, a call that may move application pages (registration, deregistration, closing
/// a context), holding [`MOVING`] for writing: the library's own threads stay off the heap
/// meanwhile. The application's threads must not write to the pages being moved
/// (docs/ibverbs.md).
pub(crate) fn while_moving<T>(f: impl FnOnce() -> T) -> T {
    let _moving = MOVING.write().unwrap_or_else(|p| p.into_inner());
    f()
}

/// Moves rnicd's events into the context's queue, one count on the async fd for each.
/// Sleeps between looks (events are rare), longer while nothing comes.
pub(crate) fn event_pump(ctx: usize, stop: Arc<AtomicBool>) {
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        // SAFETY: the context outlives this thread (close joins it before freeing).
        let c = unsafe { &*(ctx as *const Ctx) };
        // Not while pages move (MOVING); taken before the client's lock, as reg does.
        let moving = moving_read();
        let got = client(c).poll_event();
        match got {
            Some(e) => {
                idle = 0;
                c.events
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back(EventSlot::encode(&e));
                count_up(c.async_fd.as_raw_fd());
            }
            None => {
                drop(moving);
                idle = idle.saturating_add(1);
                std::thread::sleep(Duration::from_millis(if idle < 100 { 2 } else { 20 }));
            }
        }
    }
}

pub(crate) unsafe fn ctx_of<'a>(c: *mut sys::ibv_context) -> Option<&'a Ctx> {
    if c.is_null() {
        return None;
    }
    let p = (c as *mut u8).sub(offset_of!(sys::verbs_context, context)) as *const Ctx;
    Some(&*p)
}

/// A libibverbs object that names its context.
pub(crate) trait InContext {
    /// `obj->context`.
    fn context(&self) -> *mut sys::ibv_context;
}

macro_rules! in_context {
    ($($t:ty),*) => {
        $(impl InContext for $t {
            fn context(&self) -> *mut sys::ibv_context {
                self.context
            }
        })*
    };
}
in_context!(
    sys::ibv_pd,
    sys::ibv_qp,
    sys::ibv_srq,
    sys::ibv_cq,
    sys::ibv_mr,
    sys::ibv_mw,
    sys::ibv_comp_channel
);

/// The context of the object `obj` points to; `None` for a NULL object or context.
pub(crate) unsafe fn owner_ctx<'a, T: InContext>(obj: *const T) -> Option<&'a Ctx> {
    if obj.is_null() {
        return None;
    }
    ctx_of((*obj).context())
}

/// Runs `f` with the context of `obj` and the library's object it heads (a `T`), or answers
/// EINVAL for a NULL object or context: how the verbs on an object that return an errno
/// begin.
pub(crate) unsafe fn with_obj<I: InContext, T>(
    obj: *mut I,
    f: impl FnOnce(&Ctx, *mut T) -> c_int,
) -> c_int {
    match owner_ctx(obj) {
        Some(ctx) => f(ctx, obj.cast()),
        None => libc::EINVAL,
    }
}

/// A QP, CQ or SRQ: listed in its context's [`Objects`] by number (async events name it),
/// and freed only once the application has acknowledged the events it was handed.
pub(crate) trait Listed: Sized {
    /// The application's view, at the head of this object.
    type Ibv: InContext;
    /// Its table among the context's objects.
    fn table(o: &mut Objects) -> &mut HashMap<u32, usize>;
    /// Its number, rnicd's and the table's key.
    fn number(&self) -> u32;
    /// Destroys it in rnicd.
    fn destroy(&self, c: &mut RemoteContext) -> VerbsResult<()>;
    /// Its asynchronous events: those not yet acknowledged hold its memory.
    fn async_events(&self) -> &Acks;
    /// Ends what else refers to `obj` once it is destroyed, before its memory goes (a CQ's
    /// completion-channel thread and events). A pointer, not `&mut`: other threads still
    /// read it meanwhile (acknowledging its events).
    unsafe fn release(_obj: *mut Self, _ctx: &Ctx) {}
}

/// Implements [`Listed`] for `$obj`, headed by the application's `$ibv`, listed in
/// `Objects::$table` under the number `|$s| $number` gives, destroyed in rnicd by
/// `|$c, $s| $destroy`; any more items (`release`) follow.
macro_rules! listed {
    (
        $obj:ty, $ibv:ty, $table:ident,
        |$s:ident| $number:expr,
        |$c:ident, $d:ident| $destroy:expr;
        $($more:tt)*
    ) => {
        impl Listed for $obj {
            type Ibv = $ibv;
            fn table(o: &mut Objects) -> &mut HashMap<u32, usize> {
                &mut o.$table
            }
            fn number(&self) -> u32 {
                let $s = self;
                $number
            }
            fn destroy(&self, $c: &mut RemoteContext) -> VerbsResult<()> {
                let $d = self;
                $destroy
            }
            fn async_events(&self) -> &Acks {
                &self.async_events
            }
            $($more)*
        }
    };
}
pub(crate) use listed;

/// Lists a new object in its context's table: the application's pointer to it.
pub(crate) unsafe fn enlist<T: Listed>(ctx: &Ctx, obj: T) -> *mut T::Ibv {
    let p = Box::into_raw(Box::new(obj));
    T::table(&mut objects(ctx)).insert((*p).number(), p as usize);
    p as *mut T::Ibv
}

/// The listed object numbered `n`, with one more asynchronous event reported on it (while
/// the caller holds the objects: a destroy unlists it under that lock before waiting).
pub(crate) unsafe fn report<T: Listed>(objs: &mut Objects, n: u32) -> Option<*mut T::Ibv> {
    T::table(objs).get(&n).map(|&p| {
        (*(p as *const T)).async_events().report();
        p as *mut T::Ibv
    })
}

/// `ibv_destroy_qp`, `_cq` and `_srq`. The object is unlisted before rnicd frees its number
/// (numbers are reused: an object created meanwhile may take it, and no async event may
/// name the old one any more), and listed again if rnicd refuses. The client's lock is
/// released before waiting for the application to acknowledge the object's events (the
/// acking thread may need it); then it is freed. 0, or the errno of the failure.
pub(crate) unsafe fn destroy_acked<T: Listed>(ibv: *mut T::Ibv) -> c_int {
    let Some(ctx) = owner_ctx(ibv) else {
        return libc::EINVAL;
    };
    let obj = ibv as *mut T;
    let (n, key) = ((*obj).number(), obj as usize);
    let took = unlist(T::table(&mut objects(ctx)), n, key);
    let r = (*obj).destroy(&mut client(ctx));
    if let Err(e) = r {
        if took {
            T::table(&mut objects(ctx)).insert(n, key);
        }
        return errno_of(&e);
    }
    T::release(obj, ctx);
    (*obj).async_events().wait();
    drop(Box::from_raw(obj));
    0
}

pub(crate) fn client(c: &Ctx) -> std::sync::MutexGuard<'_, RemoteContext> {
    c.client.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds one to an eventfd's count: one more event to take.
pub(crate) fn count_up(fd: c_int) {
    let one = 1u64;
    // SAFETY: an 8-byte write from a local.
    unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
}

/// Takes one from an eventfd's count (semaphore mode): blocks unless the application made
/// the descriptor non-blocking (then EAGAIN in errno, as libibverbs); whether it took one.
pub(crate) fn count_down(fd: c_int) -> bool {
    let mut v = 0u64;
    // SAFETY: an 8-byte read into a local.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) == 8 }
}

pub(crate) fn eventfd(flags: c_int) -> Option<OwnedFd> {
    // SAFETY: eventfd(2); the result is checked and owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut sys::ibv_device) -> *mut sys::ibv_context {
    guard(std::ptr::null_mut(), || {
        let Some(d) = device_of(dev) else {
            return null_errno(libc::ENODEV);
        };
        let mut rc = match connect(None, Some(&d.name)) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("libibverbs (ferroce): {e}");
                return null_errno(libc::ENODEV);
            }
        };
        let Ok(limits) = rc.query_device() else {
            return null_errno(libc::EIO);
        };
        let Some(async_fd) = eventfd(libc::EFD_SEMAPHORE) else {
            return null_errno(libc::EMFILE);
        };
        let cmd_fd = match open_cmd_fd(dev) {
            Ok(f) => f,
            Err(e) => {
                return null_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
            }
        };
        // SAFETY: zero is a valid verbs_context (C data; NULL ops).
        let mut vctx: sys::verbs_context = std::mem::zeroed();
        vctx.sz = std::mem::size_of::<sys::verbs_context>();
        vctx.query_port = Some(query_port_ex);
        vctx.query_device_ex = Some(query_device_ex);
        vctx.create_cq_ex = Some(create_cq_ex);
        vctx.create_qp_ex = Some(create_qp_ex);
        let c = &mut vctx.context;
        c.device = dev;
        c.cmd_fd = cmd_fd.as_raw_fd();
        c.async_fd = async_fd.as_raw_fd();
        c.num_comp_vectors = 1;
        // verbs_get_ctx() recognises an extended context by this marker.
        c.abi_compat = usize::MAX as *mut c_void;
        c.ops.poll_cq = Some(poll_cq);
        c.ops.alloc_mw = Some(alloc_mw);
        c.ops.dealloc_mw = Some(dealloc_mw);
        c.ops.bind_mw = Some(bind_mw);
        c.ops.req_notify_cq = Some(req_notify_cq);
        c.ops.post_send = Some(post_send);
        c.ops.post_recv = Some(post_recv);
        c.ops.post_srq_recv = Some(post_srq_recv);
        let ctx = Box::new(Ctx {
            vctx,
            client: Mutex::new(rc),
            dev: d,
            async_fd,
            cmd_fd,
            limits,
            events: Mutex::new(VecDeque::new()),
            objects: Mutex::new(Objects::default()),
            event_thread: Mutex::new(None),
        });
        let p = Box::into_raw(ctx);
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let addr = p as usize;
        match std::thread::Builder::new()
            .name("ibv-async".into())
            .spawn(move || event_pump(addr, st))
        {
            Ok(h) => *(*p).event_thread.lock().unwrap_or_else(|e| e.into_inner()) = Some((stop, h)),
            Err(_) => {
                let ctx = Box::from_raw(p);
                client(&ctx).close();
                return null_errno(libc::EAGAIN);
            }
        }
        &mut (*p).vctx.context
    })
}
version!(ibv_open_device, "IBVERBS_1.1");

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(c: *mut sys::ibv_context) -> c_int {
    if ctx_of(c).is_none() {
        return libc::EINVAL;
    }
    let p = (c as *mut u8).sub(offset_of!(sys::verbs_context, context)) as *mut Ctx;
    let t = (*p)
        .event_thread
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some((stop, h)) = t {
        stop.store(true, Ordering::Release);
        let _ = h.join();
    }
    // CQs the application did not destroy stay allocated (as with libibverbs, closing does
    // not free a context's objects), but their channel threads end with the context.
    let cqs: Vec<usize> = objects(&*p).cqs.values().copied().collect();
    for q in cqs {
        if let Some((stop, h)) = (*(q as *mut Cq)).watcher.take() {
            stop.store(true, Ordering::Release);
            let _ = h.join();
        }
    }
    let ctx = Box::from_raw(p);
    // Closing ends the context's registrations: pages may move back to private memory.
    while_moving(|| client(&ctx).close());
    0
}
version!(ibv_close_device, "IBVERBS_1.1");
