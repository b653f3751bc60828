//! Asynchronous events: `ibv_get_async_event` / `ibv_ack_async_event`.

use super::*;

/// The `ibv_event_type`s whose element is a QP (a pattern).
macro_rules! QP_EVENTS {
    () => {
        sys::IBV_EVENT_COMM_EST
            | sys::IBV_EVENT_SQ_DRAINED
            | sys::IBV_EVENT_PATH_MIG
            | sys::IBV_EVENT_PATH_MIG_ERR
            | sys::IBV_EVENT_QP_FATAL
            | sys::IBV_EVENT_QP_REQ_ERR
            | sys::IBV_EVENT_QP_ACCESS_ERR
            | sys::IBV_EVENT_QP_LAST_WQE_REACHED
    };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    c: *mut sys::ibv_context,
    ev: *mut sys::ibv_async_event,
) -> c_int {
    let Some(ctx) = ctx_of(c) else {
        return neg1_errno(libc::EINVAL);
    };
    if ev.is_null() {
        return neg1_errno(libc::EINVAL);
    }
    loop {
        if !count_down(ctx.async_fd.as_raw_fd()) {
            return -1;
        }
        // Heap writes follow (see ibv_get_cq_event).
        let _moving = moving_read();
        let Some(e) = ctx
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
        else {
            continue;
        };
        // SAFETY: zero is a valid ibv_async_event.
        let mut o: sys::ibv_async_event = std::mem::zeroed();
        o.event_type = e.kind;
        // Counted on the object while the objects are held: a destroy removes the object
        // under this lock and then waits for the count to be acknowledged.
        let mut objs = objects(ctx);
        let element = match e.kind {
            sys::IBV_EVENT_CQ_ERR => report::<Cq>(&mut objs, e.object).map(|p| o.element.cq = p),
            sys::IBV_EVENT_SRQ_LIMIT_REACHED | sys::IBV_EVENT_SRQ_ERR => {
                report::<Srq>(&mut objs, e.object).map(|p| o.element.srq = p)
            }
            sys::IBV_EVENT_PORT_ACTIVE | sys::IBV_EVENT_PORT_ERR => {
                o.element.port_num = 1;
                Some(())
            }
            sys::IBV_EVENT_DEVICE_FATAL => Some(()),
            QP_EVENTS!() => report::<Qp>(&mut objs, e.object).map(|p| o.element.qp = p),
            _ => None,
        };
        drop(objs);
        // An event of an object destroyed meanwhile is not delivered.
        if element.is_some() {
            *ev = o;
            return 0;
        }
    }
}
version!(ibv_get_async_event, "IBVERBS_1.1");

/// Acknowledges an event of `ibv_get_async_event`: a destroy of its QP, CQ or SRQ waits for
/// this (rdma-core's rule).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(ev: *mut sys::ibv_async_event) {
    if ev.is_null() {
        return;
    }
    let _moving = moving_read();
    let e = &*ev;
    match e.event_type {
        sys::IBV_EVENT_CQ_ERR => ack::<Cq>(e.element.cq),
        sys::IBV_EVENT_SRQ_LIMIT_REACHED | sys::IBV_EVENT_SRQ_ERR => ack::<Srq>(e.element.srq),
        QP_EVENTS!() => ack::<Qp>(e.element.qp),
        // Port and device events name no object.
        _ => {}
    }
}

/// Acknowledges one asynchronous event of the object `obj` (none for NULL).
unsafe fn ack<T: Listed>(obj: *mut T::Ibv) {
    if !obj.is_null() {
        (*(obj as *const T)).async_events().ack(1, |_| ());
    }
}
version!(ibv_ack_async_event, "IBVERBS_1.1");
