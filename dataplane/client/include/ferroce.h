/*
 * ferroce.h - the C client of rnicd, ferroce's software RoCEv2 RNIC daemon.
 *
 * An application opens an RNIC of a running rnicd (ferroce_open), then uses verbs much as
 * with libibverbs: PDs, MRs (on any ordinary memory, zero copy), CQs with optional blocking
 * waits, SRQs, RC/UC/UD QPs, posts and polls. Posting and polling touch only shared memory;
 * create/modify/destroy calls are messages to rnicd (docs/host-protocol.md).
 *
 * Conventions: functions returning int return 0 on success or a positive errno value (also
 * stored in errno); ferroce_poll_cq returns a count or a negative errno; ferroce_open returns
 * NULL and sets errno. ferroce_last_error() describes the last failure of a context.
 * Numeric codes (QP states and types, access flags, opcodes, send flags, work completion
 * status and opcodes, async event types, MTUs) use libibverbs' values. A context is not
 * thread-safe: use it from one thread at a time.
 *
 * Link with -lferroce_client (pkg-config --cflags --libs ferroce).
 */
#ifndef FERROCE_H
#define FERROCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERROCE_ABI_VERSION 1

/* Access flags (ibv_access_flags). */
#define FERROCE_ACCESS_LOCAL_WRITE 1
#define FERROCE_ACCESS_REMOTE_WRITE 2
#define FERROCE_ACCESS_REMOTE_READ 4
#define FERROCE_ACCESS_REMOTE_ATOMIC 8
#define FERROCE_ACCESS_MW_BIND 16
#define FERROCE_ACCESS_ZERO_BASED 32 /* memory window binds only */

/* QP types (ibv_qp_type). */
#define FERROCE_QPT_RC 2
#define FERROCE_QPT_UC 3
#define FERROCE_QPT_UD 4

/* QP states (ibv_qp_state). */
#define FERROCE_QPS_RESET 0
#define FERROCE_QPS_INIT 1
#define FERROCE_QPS_RTR 2
#define FERROCE_QPS_RTS 3
#define FERROCE_QPS_SQD 4
#define FERROCE_QPS_SQE 5
#define FERROCE_QPS_ERR 6

/* ferroce_modify_qp attribute mask (ibv_qp_attr_mask). */
#define FERROCE_QP_STATE (1 << 0)
#define FERROCE_QP_CUR_STATE (1 << 1)
#define FERROCE_QP_EN_SQD_ASYNC_NOTIFY (1 << 2)
#define FERROCE_QP_ACCESS_FLAGS (1 << 3)
#define FERROCE_QP_PKEY_INDEX (1 << 4)
#define FERROCE_QP_PORT (1 << 5)
#define FERROCE_QP_QKEY (1 << 6)
#define FERROCE_QP_AV (1 << 7)
#define FERROCE_QP_PATH_MTU (1 << 8)
#define FERROCE_QP_TIMEOUT (1 << 9)
#define FERROCE_QP_RETRY_CNT (1 << 10)
#define FERROCE_QP_RNR_RETRY (1 << 11)
#define FERROCE_QP_RQ_PSN (1 << 12)
#define FERROCE_QP_MAX_QP_RD_ATOMIC (1 << 13)
#define FERROCE_QP_MIN_RNR_TIMER (1 << 15)
#define FERROCE_QP_SQ_PSN (1 << 16)
#define FERROCE_QP_MAX_DEST_RD_ATOMIC (1 << 17)
#define FERROCE_QP_DEST_QPN (1 << 20)

/* Send opcodes (ibv_wr_opcode). */
#define FERROCE_WR_RDMA_WRITE 0
#define FERROCE_WR_RDMA_WRITE_WITH_IMM 1
#define FERROCE_WR_SEND 2
#define FERROCE_WR_SEND_WITH_IMM 3
#define FERROCE_WR_RDMA_READ 4
#define FERROCE_WR_ATOMIC_CMP_AND_SWP 5
#define FERROCE_WR_ATOMIC_FETCH_AND_ADD 6
#define FERROCE_WR_LOCAL_INV 7
#define FERROCE_WR_BIND_MW 8
#define FERROCE_WR_SEND_WITH_INV 9

/* Send flags (ibv_send_flags). */
#define FERROCE_SEND_FENCE 1
#define FERROCE_SEND_SIGNALED 2
#define FERROCE_SEND_SOLICITED 4
#define FERROCE_SEND_INLINE 8

/* Work completion status and opcodes (ibv_wc_status, ibv_wc_opcode): the main ones. */
#define FERROCE_WC_SUCCESS 0
#define FERROCE_WC_LOC_LEN_ERR 1
#define FERROCE_WC_LOC_QP_OP_ERR 2
#define FERROCE_WC_LOC_PROT_ERR 4
#define FERROCE_WC_WR_FLUSH_ERR 5
#define FERROCE_WC_REM_ACCESS_ERR 10
#define FERROCE_WC_RETRY_EXC_ERR 12
#define FERROCE_WC_RNR_RETRY_EXC_ERR 13
#define FERROCE_WC_OP_SEND 0
#define FERROCE_WC_OP_RDMA_WRITE 1
#define FERROCE_WC_OP_RDMA_READ 2
#define FERROCE_WC_OP_COMP_SWAP 3
#define FERROCE_WC_OP_FETCH_ADD 4
#define FERROCE_WC_OP_RECV 128
#define FERROCE_WC_OP_RECV_RDMA_WITH_IMM 129
#define FERROCE_WC_WITH_IMM 2

/* Async event types (ibv_event_type): the main ones. */
#define FERROCE_EVENT_CQ_ERR 0
#define FERROCE_EVENT_QP_FATAL 1
#define FERROCE_EVENT_QP_REQ_ERR 2
#define FERROCE_EVENT_QP_ACCESS_ERR 3
#define FERROCE_EVENT_SQ_DRAINED 5
#define FERROCE_EVENT_PORT_ACTIVE 9
#define FERROCE_EVENT_PORT_ERR 10
#define FERROCE_EVENT_SRQ_LIMIT_REACHED 15
#define FERROCE_EVENT_QP_LAST_WQE_REACHED 16
#define FERROCE_EVENT_DEVICE_FATAL 8

/* MTUs (ibv_mtu). */
#define FERROCE_MTU_256 1
#define FERROCE_MTU_512 2
#define FERROCE_MTU_1024 3
#define FERROCE_MTU_2048 4
#define FERROCE_MTU_4096 5

/* An open RNIC (opaque). */
struct ferroce_context;

struct ferroce_device_attr {
	char fw_ver[64];
	uint64_t max_mr_size;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t max_qp;
	uint32_t max_qp_wr;
	uint32_t max_sge;
	uint32_t max_cq;
	uint32_t max_cqe;
	uint32_t max_mr;
	uint32_t max_pd;
	uint32_t max_srq;
	uint32_t max_srq_wr;
	uint32_t max_srq_sge;
	uint32_t max_inline_data;
	uint32_t max_qp_rd_atom;
	uint32_t max_qp_init_rd_atom;
	uint32_t atomic_cap;
};

struct ferroce_port_attr {
	uint32_t state;       /* 4: active, 1: down (ibv_port_state) */
	uint32_t max_mtu;     /* ibv_mtu */
	uint32_t active_mtu;  /* ibv_mtu */
	uint32_t gid_tbl_len;
	uint32_t pkey_tbl_len;
	uint32_t link_layer;  /* 2: Ethernet */
};

struct ferroce_mr {
	uint64_t addr;
	uint64_t length;
	uint32_t lkey;
	uint32_t rkey; /* 0 without remote access */
};

struct ferroce_srq_attr {
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
};

struct ferroce_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
};

struct ferroce_qp_init_attr {
	uint32_t pd;
	uint32_t send_cq;
	uint32_t recv_cq;
	uint32_t srq;     /* with use_srq */
	uint32_t use_srq;
	uint32_t qp_type; /* FERROCE_QPT_* */
	struct ferroce_qp_cap cap;
	uint32_t sq_sig_all;
};

/* An address vector (a QP's path, or a UD send's address handle). */
struct ferroce_ah_attr {
	uint8_t dgid[16];
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
	uint8_t sl;
	uint8_t dmac[6];  /* with has_dmac; else resolved from the GID */
	uint8_t has_dmac;
	uint8_t reserved;
};

struct ferroce_qp_attr {
	uint32_t qp_state;
	uint32_t cur_qp_state;
	uint32_t path_mtu;        /* ibv_mtu */
	uint32_t qp_access_flags;
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	struct ferroce_ah_attr ah_attr;
	uint16_t pkey_index;
	uint8_t port_num;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t en_sqd_async_notify;
	uint8_t reserved[2];
	struct ferroce_qp_cap cap; /* ferroce_query_qp */
};

struct ferroce_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct ferroce_send_wr {
	uint64_t wr_id;
	const struct ferroce_sge *sg_list;
	uint32_t num_sge;
	uint32_t opcode;     /* FERROCE_WR_* */
	uint32_t send_flags; /* FERROCE_SEND_* */
	uint32_t imm_data;   /* host order; for SEND_WITH_INV and LOCAL_INV: the rkey;
			      * for BIND_MW: the window's new key (its low byte counts) */
	uint64_t remote_addr; /* BIND_MW: the window's first address (in the MR) */
	uint32_t rkey;        /* BIND_MW: the window's current key */
	uint32_t bind_lkey;   /* BIND_MW: the lkey of the MR it is bound to */
	uint64_t compare_add; /* BIND_MW: the window's length (0 unbinds a type 1 window) */
	uint64_t swap;        /* BIND_MW: its access (FERROCE_ACCESS_REMOTE_*, ZERO_BASED) */
	/* UD */
	const struct ferroce_ah_attr *ah;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
};

struct ferroce_recv_wr {
	uint64_t wr_id;
	const struct ferroce_sge *sg_list;
	uint32_t num_sge;
	uint32_t reserved;
};

struct ferroce_wc {
	uint64_t wr_id;
	uint32_t status;   /* FERROCE_WC_* (ibv_wc_status) */
	uint32_t opcode;   /* FERROCE_WC_OP_* (ibv_wc_opcode) */
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data; /* host order, with FERROCE_WC_WITH_IMM */
	uint32_t invalidated_rkey;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	uint16_t pkey_index;
	uint8_t sl;
	uint8_t solicited;
};

struct ferroce_async_event {
	uint32_t event_type; /* FERROCE_EVENT_* */
	uint32_t element;    /* QP number, SRQ or CQ id */
};

/* Opens RNIC `device` ("ferroce0"...; NULL: the first) of the rnicd listening on `socket`
 * (NULL: $FERROCE_SOCKET, else /run/ferroce/rnicd.sock). NULL and errno on failure;
 * ferroce_open_error() then describes it. */
struct ferroce_context *ferroce_open(const char *socket, const char *device);
/* What made the last ferroce_open of this thread fail. */
const char *ferroce_open_error(void);
/* Releases everything the context created and closes it. */
int ferroce_close(struct ferroce_context *ctx);
/* A description of the context's last failure ("" if none). */
const char *ferroce_last_error(struct ferroce_context *ctx);

int ferroce_query_device(struct ferroce_context *ctx, struct ferroce_device_attr *attr);
int ferroce_query_port(struct ferroce_context *ctx, struct ferroce_port_attr *attr);
int ferroce_query_gid(struct ferroce_context *ctx, uint8_t index, uint8_t gid[16]);

int ferroce_alloc_pd(struct ferroce_context *ctx, uint32_t *pd);
int ferroce_dealloc_pd(struct ferroce_context *ctx, uint32_t pd);

/* Page-aligned memory shared with rnicd (NULL and errno on failure). */
void *ferroce_alloc_buf(struct ferroce_context *ctx, size_t len);
int ferroce_free_buf(struct ferroce_context *ctx, void *buf);
/* Registers `len` bytes at `addr`: memory from ferroce_alloc_buf, or ordinary memory
 * (malloc, anonymous mmap), which moves in place onto shared memory - zero copy, contents
 * kept (no other thread may write those pages during the call). File-backed, shared and
 * hugetlbfs memory is refused (EINVAL; see ferroce_last_error). */
int ferroce_reg_mr(struct ferroce_context *ctx, uint32_t pd, void *addr, size_t len, int access,
		   struct ferroce_mr *mr);
int ferroce_dereg_mr(struct ferroce_context *ctx, const struct ferroce_mr *mr);
/* Memory windows (IBA 10.6.7): `type` 1 or 2; `rkey` receives the window's key. A window
 * is bound by posting FERROCE_WR_BIND_MW on a send queue (RC or UC); type 2 windows serve
 * only the QP that bound them. An MR needs FERROCE_ACCESS_MW_BIND for windows to be bound
 * to it, and cannot be deregistered while one is (EINVAL). Deallocating unbinds. */
int ferroce_alloc_mw(struct ferroce_context *ctx, uint32_t pd, int type, uint32_t *rkey);
int ferroce_dealloc_mw(struct ferroce_context *ctx, uint32_t rkey);

int ferroce_create_cq(struct ferroce_context *ctx, uint32_t cqe, uint32_t *cq);
int ferroce_destroy_cq(struct ferroce_context *ctx, uint32_t cq);
/* Up to `n` completions into `wc`; the count, or a negative errno. */
int ferroce_poll_cq(struct ferroce_context *ctx, uint32_t cq, int n, struct ferroce_wc *wc);
/* Arms the CQ: its next completion notifies; with solicited_only, its next solicited
 * (FERROCE_SEND_SOLICITED at the sender) or unsuccessful completion. */
int ferroce_req_notify_cq(struct ferroce_context *ctx, uint32_t cq, int solicited_only);
/* The CQ's completion channel: an fd (eventfd) readable once per notification, for
 * poll/epoll; ferroce_get_cq_event consumes one. -1 and errno on failure. */
int ferroce_cq_event_fd(struct ferroce_context *ctx, uint32_t cq);
/* Waits up to timeout_ms (-1: no limit) for a notification of the armed CQ: 0, ETIMEDOUT,
 * or an errno. */
int ferroce_get_cq_event(struct ferroce_context *ctx, uint32_t cq, int timeout_ms);

int ferroce_create_srq(struct ferroce_context *ctx, uint32_t pd,
		       const struct ferroce_srq_attr *attr, uint32_t *srq);
int ferroce_modify_srq(struct ferroce_context *ctx, uint32_t srq, uint32_t srq_limit);
int ferroce_query_srq(struct ferroce_context *ctx, uint32_t srq, struct ferroce_srq_attr *attr);
int ferroce_destroy_srq(struct ferroce_context *ctx, uint32_t srq);

int ferroce_create_qp(struct ferroce_context *ctx, const struct ferroce_qp_init_attr *init,
		      uint32_t *qpn);
int ferroce_modify_qp(struct ferroce_context *ctx, uint32_t qpn,
		      const struct ferroce_qp_attr *attr, int attr_mask);
int ferroce_query_qp(struct ferroce_context *ctx, uint32_t qpn, struct ferroce_qp_attr *attr,
		     struct ferroce_qp_init_attr *init);
int ferroce_destroy_qp(struct ferroce_context *ctx, uint32_t qpn);

int ferroce_post_send(struct ferroce_context *ctx, uint32_t qpn, const struct ferroce_send_wr *wr);
int ferroce_post_recv(struct ferroce_context *ctx, uint32_t qpn, const struct ferroce_recv_wr *wr);
int ferroce_post_srq_recv(struct ferroce_context *ctx, uint32_t srq,
			  const struct ferroce_recv_wr *wr);

/* The next async event, without waiting: 0 with *ev filled, or EAGAIN. */
int ferroce_get_async_event(struct ferroce_context *ctx, struct ferroce_async_event *ev);

#ifdef __cplusplus
}
#endif

#endif /* FERROCE_H */
