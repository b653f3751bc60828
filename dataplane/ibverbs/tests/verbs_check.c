/*
 * verbs_check: a libibverbs program (built against the installed <infiniband/verbs.h>, linked
 * with -libverbs, run under ferroce-run) that checks the verbs a test suite probes: error
 * paths with the errno and completion status values rdma-core documents, the extended verbs
 * (ibv_query_device_ex, ibv_create_cq_ex polling, ibv_create_qp_ex and the ibv_wr_* API),
 * unsupported verbs answering EOPNOTSUPP, async events with their element, and destroy of
 * objects still in use (EBUSY). Both QPs live on one device and talk to its own GID
 * (internal loopback). Under ferroce's librdmacm, a destroyed rdma_cm ID or event channel
 * passed again is refused with EINVAL (rdma-core's would read freed memory).
 *
 * usage: verbs_check [-d DEVICE] [-g GID_INDEX]
 * Prints one "ok"/"FAIL" line per check; exits 1 if any check failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int failures;

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (cond) {                                                                \
			printf("ok   ");                                                       \
		} else {                                                                   \
			printf("FAIL ");                                                       \
			failures++;                                                        \
		}                                                                          \
		printf(__VA_ARGS__);                                                       \
		printf("\n");                                                              \
		fflush(stdout);                                                            \
	} while (0)

#define MUST(cond, what)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			printf("FAIL %s (errno %d: %s)\n", what, errno, strerror(errno));  \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index = 1;
static union ibv_gid gid;

/* Registered memory comes from the heap, page-aligned: ferroce registers private anonymous
 * pages (not the stack), and two MRs do not share a page. */
static void *alloc_buf(size_t n)
{
	void *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
	MUST(p, "aligned_alloc");
	memset(p, 0, n);
	return p;
}

/* A CQ, or the run ends. */
static struct ibv_cq *must_cq(int cqe, void *cq_context, struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, cqe, cq_context, ch, 0);
	MUST(cq, "ibv_create_cq");
	return cq;
}

/* `n` bytes at `buf` registered on the PD with `access`, or the run ends. */
static struct ibv_mr *must_reg(void *buf, size_t n, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, n, access);
	MUST(mr, "ibv_reg_mr");
	return mr;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Polls `cq` until `n` completions arrived or 5 s passed; returns how many. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	double end = now_s() + 5;
	while (got < n && now_s() < end) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		if (k < 0)
			return k;
		got += k;
		if (k == 0)
			usleep(100);
	}
	return got;
}

static struct ibv_qp *make_qp(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = scq,
		.recv_cq = rcq,
		.srq = srq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
			.max_recv_sge = 2, .max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

/* The attributes of an RC QP on `cq` for the wr API's operations `ops`: `send_wr` and
 * `recv_wr` WRs, `sge` SGEs each way. */
static struct ibv_qp_init_attr_ex qp_ex_attr(struct ibv_cq *cq, uint32_t send_wr, uint32_t recv_wr,
					     uint32_t sge, uint64_t ops)
{
	return (struct ibv_qp_init_attr_ex){
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = send_wr, .max_recv_wr = recv_wr, .max_send_sge = sge,
			.max_recv_sge = sge},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = ops,
	};
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* RESET -> INIT -> RTR -> RTS towards `remote` on this device's own GID. */
static int connect_qp(struct ibv_qp *qp, uint32_t remote, uint8_t rnr_retry)
{
	int e = to_init(qp);
	if (e)
		return e;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = remote,
		.rq_psn = 1,
		.max_dest_rd_atomic = 4,
		.min_rnr_timer = 1,
		.ah_attr = {.is_global = 1, .port_num = 1,
			    .grh = {.dgid = gid, .sgid_index = gid_index, .hop_limit = 64}},
	};
	e = ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (e)
		return e;
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTS,
		.timeout = 10,
		.retry_cnt = 3,
		.rnr_retry = rnr_retry,
		.sq_psn = 1,
		.max_rd_atomic = 4,
	};
	return ibv_modify_qp(qp, &r,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Connects `a` and `b` to each other; or the run ends. */
static void must_connect(struct ibv_qp *a, struct ibv_qp *b, uint8_t rnr_retry)
{
	MUST(connect_qp(a, b->qp_num, rnr_retry) == 0 && connect_qp(b, a->qp_num, rnr_retry) == 0,
	     "connect");
}

/* Two RC QPs, `a` on CQ `acq` and `b` on `bcq`, connected to each other; or the run ends. */
static void connect_pair(struct ibv_cq *acq, struct ibv_cq *bcq, uint8_t rnr_retry,
			 struct ibv_qp **a, struct ibv_qp **b)
{
	*a = make_qp(acq, acq, NULL);
	*b = make_qp(bcq, bcq, NULL);
	MUST(*a && *b, "ibv_create_qp");
	must_connect(*a, *b, rnr_retry);
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return (enum ibv_qp_state) - 1;
	return a.qp_state;
}

/* Waits up to 5 s for an async event of `type`; returns 0 and fills `ev`, or -1. */
static int wait_event(enum ibv_event_type type, struct ibv_async_event *out)
{
	double end = now_s() + 5;
	while (now_s() < end) {
		struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
		if (poll(&p, 1, 100) <= 0)
			continue;
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev))
			return -1;
		ibv_ack_async_event(&ev);
		if (ev.event_type == type) {
			*out = ev;
			return 0;
		}
	}
	return -1;
}

static void check_device(void)
{
	struct ibv_device_attr_ex dx;
	memset(&dx, 0xff, sizeof(dx));
	int e = ibv_query_device_ex(ctx, NULL, &dx);
	CHECK(e == 0 && dx.orig_attr.max_qp > 0 && dx.orig_attr.phys_port_cnt == 1,
	      "ibv_query_device_ex: max_qp %d, ports %d", dx.orig_attr.max_qp,
	      dx.orig_attr.phys_port_cnt);
	CHECK(dx.odp_caps.general_caps == 0 && dx.tso_caps.max_tso == 0 &&
		      dx.completion_timestamp_mask == 0,
	      "ibv_query_device_ex: no ODP, TSO or timestamps advertised");
	CHECK(!(dx.orig_attr.device_cap_flags & IBV_DEVICE_XRC), "no XRC advertised");
	CHECK((dx.orig_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
		      (dx.orig_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) &&
		      dx.orig_attr.max_mw > 0,
	      "memory windows (type 1 and 2B) advertised, max_mw %d", dx.orig_attr.max_mw);

	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
		      pa.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "ibv_query_port: active Ethernet port");
	CHECK(ibv_query_port(ctx, 2, &pa) != 0, "ibv_query_port on port 2 fails");

	struct ibv_gid_entry ents[16];
	ssize_t n = ibv_query_gid_table(ctx, ents, 16, 0);
	int v4 = -1;
	for (ssize_t i = 0; i < n; i++)
		if (ents[i].gid_type == IBV_GID_TYPE_ROCE_V2 &&
		    ents[i].gid.global.subnet_prefix == 0 &&
		    (ents[i].gid.raw[10] == 0xff && ents[i].gid.raw[11] == 0xff))
			v4 = (int)i;
	CHECK(n >= 2 && v4 >= 0, "ibv_query_gid_table: %zd entries, IPv4-mapped RoCEv2 at %d", n,
	      v4);
	struct ibv_gid_entry one;
	CHECK(pa.gid_tbl_len > n, "the GID table (%d entries) is larger than its populated %zd",
	      pa.gid_tbl_len, n);
	CHECK(ibv_query_gid_ex(ctx, 1, n, &one, 0) == ENODATA,
	      "ibv_query_gid_ex of an empty entry: ENODATA");
	union ibv_gid zero;
	memset(&zero, 0xee, sizeof(zero));
	CHECK(ibv_query_gid(ctx, 1, n, &zero) == 0 && zero.global.subnet_prefix == 0 &&
		      zero.global.interface_id == 0,
	      "ibv_query_gid of an empty entry: the zero GID");
	CHECK(ibv_query_gid_ex(ctx, 1, 200, &one, 0) == EINVAL,
	      "ibv_query_gid_ex past the table: EINVAL");
	CHECK(dx.phys_port_cnt_ex == 1, "ibv_query_device_ex: phys_port_cnt_ex %u",
	      dx.phys_port_cnt_ex);
	/* cmd_fd is a real descriptor (programs dup it); importing a context is not supported. */
	int dupfd = dup(ctx->cmd_fd);
	CHECK(ctx->cmd_fd >= 0 && dupfd >= 0, "context->cmd_fd %d is a descriptor", ctx->cmd_fd);
	errno = 0;
	CHECK(ibv_import_device(dupfd) == NULL && errno == EOPNOTSUPP,
	      "ibv_import_device: NULL, EOPNOTSUPP");
	close(dupfd);
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno == EBADF, "ibv_import_device(-1): EBADF");
	/* CQ limits: a completion vector the context has, no more than max_cqe entries. */
	errno = 0;
	CHECK(ibv_create_cq(ctx, 4, NULL, NULL, ctx->num_comp_vectors) == NULL && errno == EINVAL,
	      "ibv_create_cq on comp_vector %d (of %d): EINVAL", ctx->num_comp_vectors,
	      ctx->num_comp_vectors);
	errno = 0;
	CHECK(ibv_create_cq(ctx, dx.orig_attr.max_cqe + 1, NULL, NULL, 0) == NULL &&
		      errno == EINVAL,
	      "ibv_create_cq past max_cqe: EINVAL");
	struct ibv_cq_init_attr_ex cx = {.cqe = 4, .comp_vector = 7};
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cx) == NULL && errno == EINVAL,
	      "ibv_create_cq_ex on comp_vector 7: EINVAL");
	uint16_t pkey = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htobe16(0xffff),
	      "ibv_query_pkey: default P_Key");
	CHECK(ibv_query_pkey(ctx, 1, 1, &pkey) == -1, "ibv_query_pkey past the table: -1");
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0xffff)) == 0 &&
		      ibv_get_pkey_index(ctx, 1, htobe16(0x1234)) == -1,
	      "ibv_get_pkey_index: 0 for the default P_Key, -1 for another");
	struct ibv_ah_attr bad_ah = {.is_global = 1, .port_num = 1,
				     .grh = {.dgid = gid, .sgid_index = 200, .hop_limit = 64}};
	errno = 0;
	CHECK(ibv_create_ah(pd, &bad_ah) == NULL && errno == EINVAL,
	      "ibv_create_ah with a source GID index past the table: NULL, EINVAL");
	bad_ah.grh.sgid_index = gid_index;
	bad_ah.port_num = 2;
	CHECK(ibv_create_ah(pd, &bad_ah) == NULL && errno == EINVAL,
	      "ibv_create_ah on port 2: NULL, EINVAL");
	char *hint = alloc_buf(4096);
	struct ibv_mr *hmr = ibv_reg_mr(pd, hint, 4096, IBV_ACCESS_LOCAL_WRITE |
					IBV_ACCESS_RELAXED_ORDERING | (1 << 21));
	CHECK(hmr != NULL, "ibv_reg_mr with optional access hints (relaxed ordering, bit 21)");
	if (hmr)
		ibv_dereg_mr(hmr);
	free(hint);
}

static void check_unsupported(void)
{
	struct ibv_xrcd_init_attr xa = {.comp_mask = IBV_XRCD_INIT_ATTR_FD |
						     IBV_XRCD_INIT_ATTR_OFLAGS,
					.fd = -1,
					.oflags = 0};
	errno = 0;
	CHECK(ibv_open_xrcd(ctx, &xa) == NULL && errno == EOPNOTSUPP,
	      "ibv_open_xrcd: NULL, EOPNOTSUPP");
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 8,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
	};
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ca) == NULL && errno == EOPNOTSUPP,
	      "ibv_create_cq_ex with completion timestamps: NULL, EOPNOTSUPP");
	struct ibv_cq *cq = must_cq(4, NULL, NULL);
	CHECK(ibv_resize_cq(cq, 64) == 0 && cq->cqe >= 64, "ibv_resize_cq to 64: cqe %d", cq->cqe);
	struct ibv_device_attr da;
	MUST(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
	CHECK(ibv_resize_cq(cq, da.max_cqe + 1) == EINVAL && cq->cqe >= 64,
	      "ibv_resize_cq past max_cqe: EINVAL, size kept");
	struct ibv_qp_init_attr_ex qa =
		qp_ex_attr(cq, 4, 4, 1, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO);
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP,
	      "ibv_create_qp_ex with TSO: NULL, EOPNOTSUPP");
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP,
	      "ibv_create_qp_ex of an XRC QP: NULL, EOPNOTSUPP");
	char *buf = alloc_buf(64);
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) ==
			      NULL &&
		      errno == EOPNOTSUPP,
	      "ibv_reg_mr with ON_DEMAND: NULL, EOPNOTSUPP");
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 64, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "ibv_reg_mr with REMOTE_WRITE but not LOCAL_WRITE: NULL, EINVAL");
	free(buf);
	struct ibv_qp *plain = make_qp(cq, cq, NULL);
	MUST(plain, "ibv_create_qp");
	CHECK(ibv_qp_to_qp_ex(plain) == NULL, "ibv_qp_to_qp_ex of an ibv_create_qp QP: NULL");
	union ibv_gid mg = {.raw = {0xff, 0x0e}};
	CHECK(ibv_attach_mcast(plain, &mg, 0) == EOPNOTSUPP, "ibv_attach_mcast: EOPNOTSUPP");
	ibv_destroy_qp(plain);
	ibv_destroy_cq(cq);
}

static void check_state_errors(void)
{
	struct ibv_cq *cq = must_cq(16, NULL, NULL);
	struct ibv_qp *qp = make_qp(cq, cq, NULL);
	MUST(qp, "ibv_create_qp");
	char *buf = alloc_buf(64);
	struct ibv_mr *mr = must_reg(buf, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr,
	      "ibv_post_send on a RESET QP: EINVAL, bad_wr set");
	CHECK(to_init(qp) == 0 && qp_state(qp) == IBV_QPS_INIT, "RESET -> INIT");
	bad = NULL;
	CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr,
	      "ibv_post_send on an INIT QP: EINVAL");
	struct ibv_recv_wr rwr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1};
	struct ibv_recv_wr *rbad = NULL;
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0, "ibv_post_recv on an INIT QP: allowed");
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS};
	struct ibv_qp_attr nogrh = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = qp->qp_num,
		.rq_psn = 1,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 1,
		.ah_attr = {.is_global = 0, .port_num = 1, .dlid = 1},
	};
	CHECK(ibv_modify_qp(qp, &nogrh,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ==
			      EINVAL &&
		      qp_state(qp) == IBV_QPS_INIT,
	      "INIT -> RTR without a GRH (is_global 0, a LID as on InfiniBand): EINVAL");
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL && qp_state(qp) == IBV_QPS_INIT,
	      "INIT -> RTS (skipping RTR): EINVAL, state kept");
	struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR};
	CHECK(ibv_modify_qp(qp, &r, IBV_QP_STATE) == EINVAL,
	      "INIT -> RTR without its required attributes: EINVAL");
	struct ibv_sge many[8];
	for (int i = 0; i < 8; i++)
		many[i] = sge;
	rwr.sg_list = many;
	rwr.num_sge = 8;
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr,
	      "ibv_post_recv with more SGEs than max_recv_sge: EINVAL");
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
}

/* Posts `wr` alone on a newly connected pair (`rnr_retry` as given) and checks that it
 * completes with `want`; `what` names the case. */
static void fails_with(struct ibv_cq *cq, uint8_t rnr_retry, struct ibv_send_wr *wr,
		       enum ibv_wc_status want, const char *what)
{
	struct ibv_qp *a, *b;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	connect_pair(cq, cq, rnr_retry, &a, &b);
	CHECK(ibv_post_send(a, wr, &bad) == 0, "post %s", what);
	int n = poll_n(cq, &wc, 1);
	CHECK(n == 1 && wc.wr_id == wr->wr_id && wc.status == want, "%s: %s (%s)", what,
	      ibv_wc_status_str(want), n ? ibv_wc_status_str(wc.status) : "-");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
}

/* Bad keys and RNR, over a connected pair. */
static void check_completion_errors(void)
{
	struct ibv_cq *cq = must_cq(64, NULL, NULL);
	char *buf = alloc_buf(8192);
	struct ibv_mr *mr = must_reg(buf, 8192,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					     IBV_ACCESS_REMOTE_READ);
	struct ibv_wc wc[8];

	/* A bad lkey: local protection error, then the QP is in error and flushes. */
	struct ibv_qp *a, *b;
	connect_pair(cq, cq, 7, &a, &b);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey + 0x100};
	struct ibv_send_wr wr = {.wr_id = 11, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = (uintptr_t)buf + 4096, .rkey = mr->rkey}};
	struct ibv_send_wr wr2 = wr, *bad;
	wr2.wr_id = 12;
	wr2.sg_list = &(struct ibv_sge){.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	wr.next = &wr2;
	CHECK(ibv_post_send(a, &wr, &bad) == 0, "post a WRITE with a bad lkey (and one after it)");
	int n = poll_n(cq, wc, 2);
	CHECK(n == 2 && wc[0].wr_id == 11 && wc[0].status == IBV_WC_LOC_PROT_ERR &&
		      wc[1].wr_id == 12 && wc[1].status == IBV_WC_WR_FLUSH_ERR,
	      "bad lkey: IBV_WC_LOC_PROT_ERR (%s), then IBV_WC_WR_FLUSH_ERR (%s)",
	      n > 0 ? ibv_wc_status_str(wc[0].status) : "-",
	      n > 1 ? ibv_wc_status_str(wc[1].status) : "-");
	CHECK(qp_state(a) == IBV_QPS_ERR, "the QP is in IBV_QPS_ERR");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* A bad rkey: remote access error at the requester. */
	sge.lkey = mr->lkey;
	wr.next = NULL;
	wr.wr_id = 21;
	wr.wr.rdma.rkey = mr->rkey ^ 0x5500;
	fails_with(cq, 7, &wr, IBV_WC_REM_ACCESS_ERR, "a WRITE with a bad rkey");
	/* Out of the MR's bounds with the right rkey: also a remote access error. */
	wr.wr_id = 22;
	wr.wr.rdma.rkey = mr->rkey;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 8192 - 32;
	fails_with(cq, 7, &wr, IBV_WC_REM_ACCESS_ERR, "a WRITE past the end of the remote MR");

	/* No receive WQE and rnr_retry 0: RNR retry exceeded. */
	struct ibv_send_wr s = {.wr_id = 31, .sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	fails_with(cq, 0, &s, IBV_WC_RNR_RETRY_EXC_ERR,
		   "a SEND to a QP without receive WQEs (rnr_retry 0)");
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
}

/* A CQ that overflows: IBV_EVENT_CQ_ERR naming it, its QP fatal. */
static void check_cq_overflow(void)
{
	struct ibv_cq *small = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	struct ibv_cq *big = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	MUST(small && big, "ibv_create_cq");
	CHECK(small->cqe >= 1, "ibv_create_cq(1): cqe %d", small->cqe);
	char *buf = alloc_buf(4096);
	struct ibv_mr *mr = must_reg(buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp *a, *b;
	connect_pair(small, big, 7, &a, &b);
	int posted = 0;
	for (int i = 0; i < small->cqe + 8 && i < 16; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey};
		struct ibv_send_wr wr = {.wr_id = 100 + i, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED,
					 .wr.rdma = {.remote_addr = (uintptr_t)buf + 2048,
						     .rkey = mr->rkey}},
				   *bad;
		if (ibv_post_send(a, &wr, &bad) == 0)
			posted++;
	}
	CHECK(posted > small->cqe, "posted %d signaled WRITEs at a CQ of %d", posted, small->cqe);
	struct ibv_async_event ev;
	CHECK(wait_event(IBV_EVENT_CQ_ERR, &ev) == 0 && ev.element.cq == small,
	      "CQ overflow: IBV_EVENT_CQ_ERR with element.cq = the CQ");
	CHECK(wait_event(IBV_EVENT_QP_FATAL, &ev) == 0 && ev.element.qp == a,
	      "its QP: IBV_EVENT_QP_FATAL with element.qp = the QP");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(small);
	ibv_destroy_cq(big);
}

/* Destroying what other objects still use: EBUSY, and nothing is lost. */
static void check_busy(void)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	MUST(ch, "ibv_create_comp_channel");
	struct ibv_cq *cq = must_cq(8, NULL, ch);
	struct ibv_pd *p = ibv_alloc_pd(ctx);
	MUST(p, "ibv_alloc_pd");
	char *buf = alloc_buf(64);
	struct ibv_mr *mr = ibv_reg_mr(p, buf, 64, IBV_ACCESS_LOCAL_WRITE);
	MUST(mr, "ibv_reg_mr");
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 8, .max_sge = 1}};
	struct ibv_srq *srq = ibv_create_srq(p, &sa);
	MUST(srq, "ibv_create_srq");
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .srq = srq,
				      .cap = {.max_send_wr = 4, .max_send_sge = 1},
				      .qp_type = IBV_QPT_RC};
	struct ibv_qp *qp = ibv_create_qp(p, &qa);
	MUST(qp, "ibv_create_qp");
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "destroy a channel a CQ uses: EBUSY");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy a CQ a QP uses: EBUSY");
	CHECK(ibv_destroy_srq(srq) == EBUSY, "destroy an SRQ a QP uses: EBUSY");
	CHECK(ibv_dealloc_pd(p) == EBUSY, "dealloc a PD with a QP, SRQ and MR: EBUSY");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_srq(srq) == 0 && ibv_destroy_cq(cq) == 0 &&
		      ibv_destroy_comp_channel(ch) == 0,
	      "in order: QP, SRQ, CQ, channel destroyed");
	CHECK(ibv_dealloc_pd(p) == EBUSY, "dealloc a PD with an MR: EBUSY");
	CHECK(ibv_dereg_mr(mr) == 0, "MR released");
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1,
				 .grh = {.dgid = gid, .sgid_index = gid_index, .hop_limit = 64}};
	struct ibv_ah *ah = ibv_create_ah(p, &aa);
	MUST(ah, "ibv_create_ah");
	CHECK(ibv_dealloc_pd(p) == EBUSY, "dealloc a PD with an AH: EBUSY");
	CHECK(ibv_destroy_ah(ah) == 0 && ibv_dealloc_pd(p) == 0, "AH, then PD released");
	free(buf);
}

/* ibv_destroy_cq waits until the events ibv_get_cq_event handed out are acknowledged
 * (rdma-core's rule: no thread may still hold an event of a freed CQ). */
/* Destroys a QP (if set) or a CQ on another thread, so the test can see it wait. */
struct destroyer {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	volatile int done;
	int rc;
};

static void *destroy_thread(void *p)
{
	struct destroyer *d = p;
	d->rc = d->qp ? ibv_destroy_qp(d->qp) : ibv_destroy_cq(d->cq);
	d->done = 1;
	return NULL;
}

/* The same for a QP and its async event (SQ_DRAINED on entering an empty SQD). */
static void check_async_acks(void)
{
	struct ibv_cq *cq = must_cq(8, NULL, NULL);
	struct ibv_qp *a, *b;
	connect_pair(cq, cq, 7, &a, &b);
	struct ibv_qp_attr sqd = {.qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1};
	CHECK(ibv_modify_qp(a, &sqd, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0,
	      "RTS -> SQD with en_sqd_async_notify");
	struct ibv_async_event ev;
	int got = -1;
	double end = now_s() + 5;
	while (got && now_s() < end) {
		struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
		if (poll(&p, 1, 100) <= 0)
			continue;
		MUST(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
		if (ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == a)
			got = 0;
		else
			ibv_ack_async_event(&ev);
	}
	CHECK(got == 0, "IBV_EVENT_SQ_DRAINED with element.qp = the QP");
	if (got == 0) {
		struct destroyer d = {.qp = a};
		pthread_t th;
		MUST(pthread_create(&th, NULL, destroy_thread, &d) == 0, "pthread_create");
		usleep(300000);
		CHECK(!d.done, "ibv_destroy_qp waits while its async event is not acknowledged");
		/* Verbs on the context still work meanwhile (the destroy holds no lock). */
		struct ibv_wc wc;
		struct ibv_port_attr pa;
		CHECK(ibv_poll_cq(cq, 1, &wc) >= 0 && ibv_query_port(ctx, 1, &pa) == 0,
		      "other verbs run while the destroy waits");
		ibv_ack_async_event(&ev);
		pthread_join(th, NULL);
		CHECK(d.done && d.rc == 0, "and returns once it is (ibv_ack_async_event)");
	} else {
		ibv_destroy_qp(a);
	}
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
}

/* ibv_req_notify_cq(cq, 1): only a solicited (or unsuccessful) completion notifies. */
static int send_one(struct ibv_qp *qp, struct ibv_mr *mr, char *data, unsigned flags)
{
	struct ibv_sge sge = {.addr = (uintptr_t)data, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 3, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = flags}, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

static void check_solicited(void)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	MUST(ch, "ibv_create_comp_channel");
	struct ibv_cq *scq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	MUST(scq && rcq, "ibv_create_cq");
	struct ibv_qp *a, *b;
	connect_pair(scq, rcq, 7, &a, &b);
	char *buf = alloc_buf(4096);
	struct ibv_mr *mr = must_reg(buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)buf + 1024 + 64 * i, .length = 64,
				      .lkey = mr->lkey};
		struct ibv_recv_wr rwr = {.wr_id = 10 + i, .sg_list = &sge, .num_sge = 1}, *rbad;
		MUST(ibv_post_recv(b, &rwr, &rbad) == 0, "ibv_post_recv");
	}
	MUST(ibv_req_notify_cq(rcq, 1) == 0, "ibv_req_notify_cq(solicited_only)");
	MUST(send_one(a, mr, buf, 0) == 0, "ibv_post_send");
	struct ibv_wc wc;
	CHECK(poll_n(rcq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS,
	      "an unsolicited SEND arrived");
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 300) == 0, "armed solicited-only, it did not notify");
	MUST(send_one(a, mr, buf, IBV_SEND_SOLICITED) == 0, "ibv_post_send");
	CHECK(poll(&pfd, 1, 5000) == 1, "a solicited SEND notified");
	struct ibv_cq *evcq;
	void *evctx;
	if (pfd.revents & POLLIN && ibv_get_cq_event(ch, &evcq, &evctx) == 0)
		ibv_ack_cq_events(evcq, 1);
	poll_n(rcq, &wc, 1);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(rcq);
	ibv_destroy_cq(scq);
	ibv_destroy_comp_channel(ch);
	ibv_dereg_mr(mr);
	free(buf);
}

static void check_event_acks(void)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	MUST(ch, "ibv_create_comp_channel");
	struct ibv_cq *cq = must_cq(8, (void *)0x5eed, ch);
	struct ibv_qp *a, *b;
	connect_pair(cq, cq, 7, &a, &b);
	char *buf = alloc_buf(4096);
	struct ibv_mr *mr = must_reg(buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	MUST(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 1024;
	wr.wr.rdma.rkey = mr->rkey;
	MUST(ibv_post_send(a, &wr, &bad) == 0, "ibv_post_send");
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 5000) == 1, "the channel's fd becomes readable");
	struct ibv_cq *evcq = NULL;
	void *evctx = NULL;
	CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == 0 && evcq == cq && evctx == (void *)0x5eed,
	      "ibv_get_cq_event: the CQ and its context");
	struct ibv_wc wc;
	CHECK(poll_n(cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS, "the WRITE completed");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	struct destroyer d = {.cq = cq};
	pthread_t th;
	MUST(pthread_create(&th, NULL, destroy_thread, &d) == 0, "pthread_create");
	usleep(300000);
	CHECK(!d.done, "ibv_destroy_cq waits while an event is not acknowledged");
	ibv_ack_cq_events(cq, 1);
	pthread_join(th, NULL);
	CHECK(d.done && d.rc == 0, "and returns once it is (ibv_ack_cq_events)");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "then the channel is free");
	ibv_dereg_mr(mr);
	free(buf);
}

/* Starts a batch on `x` with a signaled WRITE `wr_id` of `len` bytes of `mr`, `src` to `dst`. */
static void start_write(struct ibv_qp_ex *x, uint64_t wr_id, struct ibv_mr *mr, void *src,
			void *dst, uint32_t len)
{
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, len);
}

/* A second thread's ibv_start_poll on the same CQ (it must wait for our ibv_end_poll). */
struct second_poll {
	struct ibv_cq_ex *cq;
	volatile int done;
	uint64_t wr_id;
};

static void *second_poll_thread(void *arg)
{
	struct second_poll *p = arg;
	struct ibv_poll_cq_attr pa = {0};
	double end = now_s() + 5;
	int r;
	while ((r = ibv_start_poll(p->cq, &pa)) == ENOENT && now_s() < end)
		usleep(100);
	if (r == 0) {
		p->wr_id = p->cq->wr_id;
		ibv_end_poll(p->cq);
	}
	p->done = 1;
	return NULL;
}

/* ibv_create_qp_ex + the ibv_wr_* API, ibv_create_cq_ex + its poll API, ibv_rereg_mr. */
static void check_extended(void)
{
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_IMM,
	};
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cqx != NULL, "ibv_create_cq_ex (byte_len, qp_num, imm)");
	if (!cqx)
		return;
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	struct ibv_qp_init_attr_ex qa =
		qp_ex_attr(cq, 16, 16, 2,
			   IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM |
				   IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				   IBV_QP_EX_WITH_SEND);
	qa.cap.max_inline_data = 64;
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa);
	struct ibv_qp *b = make_qp(cq, cq, NULL);
	CHECK(a && b, "ibv_create_qp_ex with send_ops_flags");
	if (!a || !b)
		return;
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	CHECK(x != NULL, "ibv_qp_to_qp_ex of an ibv_create_qp_ex QP");
	must_connect(a, b, 7);
	char *buf = alloc_buf(8192);
	struct ibv_mr *mr = must_reg(buf, 8192,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	char *src = buf, *dst = buf + 1024, *rd = buf + 2048, *rx = buf + 3072;
	uint64_t *counter = (uint64_t *)(buf + 4096), *old = (uint64_t *)(buf + 4104);
	for (int i = 0; i < 256; i++)
		src[i] = (char)(i * 7 + 1);
	*counter = 40;
	struct ibv_sge rsge = {.addr = (uintptr_t)rx, .length = 256, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 900, .sg_list = &rsge, .num_sge = 1}, *rbad;
	MUST(ibv_post_recv(b, &rwr, &rbad) == 0, "ibv_post_recv");

	/* A batch: WRITE src->dst, READ dst->rd, FETCH_ADD, SEND_WITH_IMM inline. */
	start_write(x, 1, mr, src, dst, 256);
	x->wr_id = 2;
	ibv_wr_rdma_read(x, mr->rkey, (uintptr_t)dst);
	struct ibv_sge two[2] = {{.addr = (uintptr_t)rd, .length = 100, .lkey = mr->lkey},
				 {.addr = (uintptr_t)rd + 100, .length = 156, .lkey = mr->lkey}};
	ibv_wr_set_sge_list(x, 2, two);
	x->wr_id = 3;
	ibv_wr_atomic_fetch_add(x, mr->rkey, (uintptr_t)counter, 2);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)old, 8);
	x->wr_id = 4;
	ibv_wr_send_imm(x, htobe32(0xabcd1234));
	ibv_wr_set_inline_data(x, "hello, ferroce", 14);
	int e = ibv_wr_complete(x);
	CHECK(e == 0, "ibv_wr_complete of WRITE, READ, FETCH_ADD, SEND_WITH_IMM: %d", e);

	/* The extended poll API. */
	int seen = 0, good = 0, recv_ok = 0;
	double end = now_s() + 5;
	struct ibv_poll_cq_attr pa = {0};
	while (seen < 5 && now_s() < end) {
		int r = ibv_start_poll(cqx, &pa);
		if (r == ENOENT) {
			usleep(100);
			continue;
		}
		if (r)
			break;
		do {
			seen++;
			if (cqx->status == IBV_WC_SUCCESS)
				good++;
			if (cqx->wr_id == 900 && ibv_wc_read_opcode(cqx) == IBV_WC_RECV &&
			    ibv_wc_read_byte_len(cqx) == 14 &&
			    ibv_wc_read_imm_data(cqx) == htobe32(0xabcd1234) &&
			    ibv_wc_read_qp_num(cqx) == b->qp_num &&
			    (ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM))
				recv_ok = 1;
		} while (seen < 5 && ibv_next_poll(cqx) == 0);
		ibv_end_poll(cqx);
	}
	CHECK(seen == 5 && good == 5, "ibv_start_poll/next_poll: %d completions, %d successful",
	      seen, good);
	CHECK(recv_ok, "the receive: opcode, byte_len 14, imm, qp_num, IBV_WC_WITH_IMM");
	CHECK(memcmp(src, dst, 256) == 0 && memcmp(src, rd, 256) == 0,
	      "WRITE then READ moved the bytes");
	CHECK(*old == 40 && *counter == 42, "FETCH_ADD: old %" PRIu64 ", now %" PRIu64, *old,
	      *counter);
	CHECK(memcmp(rx, "hello, ferroce", 14) == 0, "inline SEND data arrived");

	/* Errors while building fail the batch, and nothing of it is posted. */
	start_write(x, 5, mr, src, dst, 8);
	x->wr_id = 6;
	ibv_wr_send(x);
	char big[1024] = {0};
	ibv_wr_set_inline_data(x, big, sizeof(big));
	CHECK(ibv_wr_complete(x) == EINVAL, "a batch with too much inline data: EINVAL");
	/* A valid WRITE, then a FETCH_ADD into 4 bytes (an ATOMIC needs 8): the whole batch
	 * fails, the WRITE included (ibv_wr_post(3): the entire posting is aborted). */
	start_write(x, 9, mr, src, dst, 8);
	x->wr_id = 10;
	ibv_wr_atomic_fetch_add(x, mr->rkey, (uintptr_t)counter, 1);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)old, 4);
	CHECK(ibv_wr_complete(x) == EINVAL, "a batch with a 4-byte ATOMIC buffer: EINVAL");
	ibv_wr_start(x);
	x->wr_id = 7;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 8);
	ibv_wr_abort(x);
	usleep(20000);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "failed and aborted batches posted nothing");
	CHECK(ibv_wr_complete(x) == EINVAL, "ibv_wr_complete without ibv_wr_start: EINVAL");

	/* ibv_start_poll .. ibv_end_poll holds the CQ: another thread's start_poll waits, so
	 * the completion being read (wr_id, read_*) stays ours (rxe locks the CQ so). */
	start_write(x, 11, mr, src, dst, 8);
	x->wr_id = 12;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 8);
	MUST(ibv_wr_complete(x) == 0, "two WRITEs");
	struct ibv_poll_cq_attr spa = {0};
	double until = now_s() + 5;
	int sr;
	while ((sr = ibv_start_poll(cqx, &spa)) == ENOENT && now_s() < until)
		usleep(100);
	MUST(sr == 0, "ibv_start_poll of the first WRITE");
	uint64_t mine = cqx->wr_id;
	struct second_poll sp = {.cq = cqx};
	pthread_t spt;
	MUST(pthread_create(&spt, NULL, second_poll_thread, &sp) == 0, "pthread_create");
	usleep(50000);
	CHECK(!sp.done && cqx->wr_id == mine && mine == 11,
	      "a second thread's ibv_start_poll waits for ibv_end_poll (done %d, wr_id %" PRIu64
	      ")",
	      sp.done, (uint64_t)cqx->wr_id);
	ibv_end_poll(cqx);
	pthread_join(spt, NULL);
	CHECK(sp.done && sp.wr_id == 12, "then it reads the second (wr_id %" PRIu64 ")", sp.wr_id);

	/* ibv_rereg_mr: new access; the MR keeps working with its new keys. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0,
	      "ibv_rereg_mr(CHANGE_ACCESS)");
	ibv_wr_start(x);
	x->wr_id = 8;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)rd, 8);
	CHECK(ibv_wr_complete(x) == 0, "post a READ of the re-registered MR");
	int n = poll_n(cq, &wc, 1);
	CHECK(n == 1 && wc.wr_id == 8 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "READ after remote read was dropped by rereg: IBV_WC_REM_ACCESS_ERR (%s)",
	      n ? ibv_wc_status_str(wc.status) : "-");
	CHECK(ibv_rereg_mr(mr, 0x40, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
	      "ibv_rereg_mr with unknown flags: IBV_REREG_MR_ERR_INPUT");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
}

/* UD on one device: a's message reaches b, and b answers through an address handle made from
 * the completion and the GRH area in front of the data (ibv_create_ah_from_wc), as a UD
 * server does. Over IPv4 (GID index 1) the GRH area holds the IPv4 header at byte 20. */
static struct ibv_qp *make_ud(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_UD,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		return NULL;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111};
	struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR};
	struct ibv_qp_attr t = {.qp_state = IBV_QPS_RTS, .sq_psn = 7};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ||
	    ibv_modify_qp(qp, &r, IBV_QP_STATE) ||
	    ibv_modify_qp(qp, &t, IBV_QP_STATE | IBV_QP_SQ_PSN)) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

static int ud_send(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn, struct ibv_mr *mr,
		   char *data, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)data, .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = 0x11111111;
	return ibv_post_send(qp, &wr, &bad);
}

static int ud_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *into)
{
	struct ibv_sge sge = {.addr = (uintptr_t)into, .length = 40 + 64, .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 88, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

/* Waits for the receive completion (wr_id 88) among `cq`'s, into `out`. */
static int wait_recv(struct ibv_cq *cq, struct ibv_wc *out)
{
	double end = now_s() + 5;
	struct ibv_wc wc;
	while (now_s() < end) {
		int k = ibv_poll_cq(cq, 1, &wc);
		if (k < 0)
			return 0;
		if (k == 0) {
			usleep(100);
			continue;
		}
		if (wc.wr_id == 88) {
			*out = wc;
			return 1;
		}
	}
	return 0;
}

static void check_ud_reply(void)
{
	struct ibv_cq *cq = must_cq(32, NULL, NULL);
	struct ibv_qp *a = make_ud(cq), *b = make_ud(cq);
	CHECK(a && b, "two UD QPs to RTS");
	if (!a || !b)
		return;
	char *buf = alloc_buf(4096);
	struct ibv_mr *mr = must_reg(buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	char *ping = buf, *pong = buf + 64, *rxa = buf + 1024, *rxb = buf + 2048;
	strcpy(ping, "ping");
	strcpy(pong, "pong");
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1,
				 .grh = {.dgid = gid, .sgid_index = gid_index, .hop_limit = 64}};
	struct ibv_ah *to_b = ibv_create_ah(pd, &aa);
	MUST(to_b, "ibv_create_ah");
	MUST(ud_recv(b, mr, rxb) == 0 && ud_recv(a, mr, rxa) == 0, "ibv_post_recv");
	MUST(ud_send(a, to_b, b->qp_num, mr, ping, 5) == 0, "ibv_post_send");
	struct ibv_wc wc;
	int got = wait_recv(cq, &wc);
	CHECK(got && wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_GRH) &&
		      wc.src_qp == a->qp_num && wc.byte_len == 45 && !strcmp(rxb + 40, "ping"),
	      "UD receive: GRH flag, src_qp, byte_len 40 + 5, data");
	struct ibv_ah_attr from;
	int e = ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)rxb, &from);
	CHECK(e == 0 && from.is_global && !memcmp(&from.grh.dgid, &gid, 16) &&
		      from.grh.sgid_index == gid_index,
	      "ibv_init_ah_from_wc: the sender's GID and our GID index %d (got %d, index %d)",
	      gid_index, e, from.grh.sgid_index);
	struct ibv_ah *back = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)rxb, 1);
	CHECK(back != NULL, "ibv_create_ah_from_wc");
	if (back) {
		MUST(ud_send(b, back, wc.src_qp, mr, pong, 5) == 0, "ibv_post_send (reply)");
		struct ibv_wc r;
		got = wait_recv(cq, &r);
		CHECK(got && r.status == IBV_WC_SUCCESS && r.qp_num == a->qp_num &&
			      !strcmp(rxa + 40, "pong"),
		      "the reply through the AH from the completion arrived");
		ibv_destroy_ah(back);
	}
	/* A GRH area that is neither IPv6 nor IPv4: refused. */
	char junk[40] = {0};
	errno = 0;
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)junk, &from) == -1 &&
		      errno == EINVAL,
	      "ibv_init_ah_from_wc of a GRH area that is not an IP header: -1, EINVAL");
	ibv_destroy_ah(to_b);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
}

/* The exported ibv_query_port symbol (programs and bindings that call it rather than the
 * header's inline wrapper) fills the older, 48-byte _compat_ibv_port_attr and nothing past
 * it. */
static void check_compat_query_port(void)
{
	unsigned char raw[sizeof(struct ibv_port_attr) + 16];
	memset(raw, 0xaa, sizeof(raw));
	int e = (ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)raw);
	struct ibv_port_attr pa;
	memcpy(&pa, raw, sizeof(pa));
	size_t compat = offsetof(struct ibv_port_attr, port_cap_flags2);
	CHECK(e == 0 && pa.state == IBV_PORT_ACTIVE && pa.active_mtu >= IBV_MTU_256 &&
		      pa.link_layer == IBV_LINK_LAYER_ETHERNET && raw[compat] == 0xaa,
	      "the exported ibv_query_port fills the %zu-byte compat layout (state %d)", compat,
	      pa.state);
}

/* Two threads build and post wr-API batches on one QP at once: libibverbs makes
 * wr_start..wr_complete a critical section per QP (ibv_wr_post(3)). */
struct batch_thread {
	struct ibv_qp_ex *x;
	struct ibv_mr *mr;
	char *src, *dst;
	int ok;
};

#define BATCHES 200

static void *batch_worker(void *p)
{
	struct batch_thread *t = p;
	for (int i = 0; i < BATCHES; i++) {
		int e;
		/* The send queue may be full for a moment: build the batch again and retry. */
		for (;;) {
			ibv_wr_start(t->x);
			t->x->wr_id = 5000 + i;
			t->x->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(t->x, t->mr->rkey, (uintptr_t)t->dst);
			ibv_wr_set_sge(t->x, t->mr->lkey, (uintptr_t)t->src, 64);
			if ((e = ibv_wr_complete(t->x)) != ENOMEM)
				break;
			usleep(50);
		}
		if (e == 0)
			t->ok++;
	}
	return NULL;
}

static void check_wr_threads(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * BATCHES + 16, NULL, NULL, 0);
	MUST(cq, "ibv_create_cq");
	struct ibv_qp_init_attr_ex qa = qp_ex_attr(cq, 32, 4, 1, IBV_QP_EX_WITH_RDMA_WRITE);
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa);
	struct ibv_qp *b = make_qp(cq, cq, NULL);
	MUST(a && b, "QPs");
	must_connect(a, b, 7);
	char *buf = alloc_buf(8192);
	struct ibv_mr *mr = must_reg(buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct batch_thread t[2] = {
		{.x = ibv_qp_to_qp_ex(a), .mr = mr, .src = buf, .dst = buf + 4096},
		{.x = ibv_qp_to_qp_ex(a), .mr = mr, .src = buf + 64, .dst = buf + 4096 + 64},
	};
	pthread_t th[2];
	/* Completions are drained while the threads post, so the queue keeps moving. */
	for (int i = 0; i < 2; i++)
		MUST(pthread_create(&th[i], NULL, batch_worker, &t[i]) == 0, "pthread_create");
	int done = 0, good = 0;
	double end = now_s() + 20;
	struct ibv_wc wc[16];
	while (done < 2 * BATCHES && now_s() < end) {
		int k = ibv_poll_cq(cq, 16, wc);
		for (int i = 0; i < k; i++) {
			done++;
			good += wc[i].status == IBV_WC_SUCCESS;
		}
		if (k == 0)
			usleep(50);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK(t[0].ok == BATCHES && t[1].ok == BATCHES && done == 2 * BATCHES &&
		      good == done,
	      "two threads, %d wr batches each on one QP: %d and %d posted, %d completions, "
	      "%d successful",
	      BATCHES, t[0].ok, t[1].ok, done, good);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	free(buf);
	ibv_destroy_cq(cq);
}

/* Bad arguments to the exported functions (not the header's inline wrappers, which
 * dereference their arguments themselves): an error, never a crash. */
static void check_bad_arguments(void)
{
	int bad = 0;
#define EXPECT(cond)                                                                       \
	do {                                                                               \
		if (!(cond)) {                                                             \
			printf("     not as expected: %s\n", #cond);                          \
			bad++;                                                             \
		}                                                                          \
	} while (0)
	struct ibv_device_attr da;
	union ibv_gid g;
	uint16_t pk;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	struct ibv_srq_attr sa;
	struct ibv_async_event ev;
	struct ibv_ah_attr aa;
	struct ibv_wc wc = {0};
	struct ibv_cq *ecq;
	void *ectx;
	EXPECT(ibv_open_device(NULL) == NULL);
	EXPECT(ibv_close_device(NULL) != 0);
	EXPECT(ibv_get_device_name(NULL) == NULL);
	ibv_free_device_list(NULL);
	EXPECT(ibv_query_device(NULL, &da) != 0);
	EXPECT(ibv_query_device(ctx, NULL) != 0);
	EXPECT((ibv_query_port)(NULL, 1, NULL) != 0);
	EXPECT((ibv_query_port)(ctx, 1, NULL) != 0);
	EXPECT(ibv_query_gid(NULL, 1, 0, &g) != 0);
	EXPECT(ibv_query_gid(ctx, 1, 0, NULL) != 0);
	EXPECT(ibv_query_gid(ctx, 1, -1, &g) != 0);
	EXPECT(ibv_query_gid(ctx, 9, 0, &g) != 0);
	EXPECT(ibv_query_pkey(NULL, 1, 0, &pk) == -1);
	EXPECT(ibv_query_pkey(ctx, 1, 0, NULL) == -1);
	EXPECT(ibv_alloc_pd(NULL) == NULL);
	EXPECT(ibv_dealloc_pd(NULL) != 0);
	char *buf = alloc_buf(4096);
	char on_stack[64];
	EXPECT(ibv_reg_mr(NULL, buf, 4096, 0) == NULL);
	EXPECT(ibv_reg_mr(pd, NULL, 4096, 0) == NULL);
	EXPECT(ibv_reg_mr(pd, buf, 0, 0) == NULL);
	EXPECT(ibv_reg_mr(pd, on_stack, sizeof(on_stack), 0) == NULL);
	EXPECT(ibv_reg_mr(pd, (void *)"read-only", 9, IBV_ACCESS_LOCAL_WRITE) == NULL);
	EXPECT(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_ON_DEMAND) == NULL);
	EXPECT(ibv_reg_mr(pd, (void *)16, 4096, 0) == NULL);
	EXPECT(ibv_dereg_mr(NULL) != 0);
	EXPECT(ibv_rereg_mr(NULL, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 0) ==
	       IBV_REREG_MR_ERR_INPUT);
	EXPECT(ibv_create_comp_channel(NULL) == NULL);
	EXPECT(ibv_destroy_comp_channel(NULL) != 0);
	EXPECT(ibv_create_cq(NULL, 8, NULL, NULL, 0) == NULL);
	EXPECT(ibv_create_cq(ctx, -1, NULL, NULL, 0) == NULL);
	EXPECT(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL);
	EXPECT(ibv_create_cq(ctx, 1 << 30, NULL, NULL, 0) == NULL);
	EXPECT(ibv_destroy_cq(NULL) != 0);
	EXPECT(ibv_resize_cq(NULL, 8) != 0);
	EXPECT(ibv_get_cq_event(NULL, &ecq, &ectx) != 0);
	ibv_ack_cq_events(NULL, 1);
	EXPECT(ibv_create_srq(NULL, NULL) == NULL);
	EXPECT(ibv_create_srq(pd, NULL) == NULL);
	struct ibv_srq_init_attr huge_srq = {.attr = {.max_wr = 1u << 30, .max_sge = 1}};
	EXPECT(ibv_create_srq(pd, &huge_srq) == NULL);
	EXPECT(ibv_destroy_srq(NULL) != 0);
	EXPECT(ibv_query_srq(NULL, &sa) != 0);
	EXPECT(ibv_modify_srq(NULL, &sa, IBV_SRQ_LIMIT) != 0);
	EXPECT(ibv_create_qp(NULL, &qia) == NULL);
	EXPECT(ibv_create_qp(pd, NULL) == NULL);
	struct ibv_cq *cq = must_cq(8, NULL, NULL);
	struct ibv_qp_init_attr bad_type = {.send_cq = cq, .recv_cq = cq, .qp_type = 99,
					    .cap = {.max_send_wr = 1, .max_recv_wr = 1,
						    .max_send_sge = 1, .max_recv_sge = 1}};
	EXPECT(ibv_create_qp(pd, &bad_type) == NULL);
	struct ibv_qp_init_attr no_cq = bad_type;
	no_cq.qp_type = IBV_QPT_RC;
	no_cq.send_cq = NULL;
	EXPECT(ibv_create_qp(pd, &no_cq) == NULL);
	struct ibv_qp_init_attr too_big = bad_type;
	too_big.qp_type = IBV_QPT_RC;
	too_big.cap.max_send_wr = 1u << 30;
	EXPECT(ibv_create_qp(pd, &too_big) == NULL);
	too_big.cap.max_send_wr = 1;
	too_big.cap.max_send_sge = 1000;
	EXPECT(ibv_create_qp(pd, &too_big) == NULL);
	too_big.cap.max_send_sge = 1;
	too_big.cap.max_inline_data = 1u << 20;
	EXPECT(ibv_create_qp(pd, &too_big) == NULL);
	EXPECT(ibv_destroy_qp(NULL) != 0);
	EXPECT(ibv_modify_qp(NULL, &qa, IBV_QP_STATE) != 0);
	EXPECT(ibv_query_qp(NULL, &qa, IBV_QP_STATE, &qia) != 0);
	struct ibv_qp *qp = make_qp(cq, cq, NULL);
	MUST(qp, "make_qp");
	EXPECT(ibv_modify_qp(qp, NULL, IBV_QP_STATE) != 0);
	EXPECT(ibv_query_qp(qp, NULL, IBV_QP_STATE, &qia) != 0);
	struct ibv_qp_attr st = {.qp_state = 99};
	EXPECT(ibv_modify_qp(qp, &st, IBV_QP_STATE) != 0);
	struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 7};
	EXPECT(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS) != 0);
	EXPECT(to_init(qp) == 0);
	struct ibv_qp_attr rtr = {.qp_state = IBV_QPS_RTR, .path_mtu = 9, .dest_qp_num = 1,
				  .ah_attr = {.is_global = 1, .port_num = 1,
					      .grh = {.dgid = gid, .sgid_index = 250}}};
	EXPECT(ibv_modify_qp(qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0);
	/* Posts with bad lists: an error and bad_wr at the culprit, through the context ops. */
	struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = NULL, .num_sge = 3}, *rbad = NULL;
	EXPECT(ibv_post_recv(qp, &rwr, &rbad) != 0 && rbad == &rwr);
	rwr.num_sge = -1;
	EXPECT(ibv_post_recv(qp, &rwr, &rbad) != 0);
	struct ibv_sge many[40] = {{0}};
	struct ibv_send_wr swr = {.wr_id = 2, .sg_list = many, .num_sge = 40,
				  .opcode = IBV_WR_SEND}, *sbad = NULL;
	EXPECT(ibv_post_send(qp, &swr, &sbad) != 0 && sbad == &swr);
	swr.num_sge = 1;
	swr.opcode = 77;
	EXPECT(ibv_post_send(qp, &swr, &sbad) != 0);
	EXPECT(ibv_poll_cq(cq, -1, &wc) < 0);
	EXPECT(ibv_poll_cq(cq, 4, NULL) < 0);
	EXPECT(ibv_create_ah(NULL, &aa) == NULL);
	EXPECT(ibv_create_ah(pd, NULL) == NULL);
	EXPECT(ibv_destroy_ah(NULL) != 0);
	EXPECT(ibv_init_ah_from_wc(NULL, 1, &wc, NULL, &aa) != 0);
	EXPECT(ibv_create_ah_from_wc(NULL, &wc, NULL, 1) == NULL);
	EXPECT(ibv_create_ah_from_wc(pd, &wc, NULL, 1) == NULL);
	EXPECT(ibv_get_async_event(NULL, &ev) != 0);
	EXPECT(ibv_get_async_event(ctx, NULL) != 0);
	ibv_ack_async_event(NULL);
	EXPECT(ibv_attach_mcast(NULL, NULL, 0) != 0);
	EXPECT(ibv_detach_mcast(NULL, NULL, 0) != 0);
	EXPECT(ibv_wc_status_str(9999) != NULL && ibv_event_type_str(9999) != NULL &&
	       ibv_node_type_str(9999) != NULL && ibv_port_state_str(9999) != NULL);
	EXPECT(ibv_rate_to_mult(9999) == -1 && ibv_rate_to_mbps(9999) == -1);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	free(buf);
#undef EXPECT
	CHECK(bad == 0, "bad arguments to every exported verb: errors, no crash (%d unexpected)",
	      bad);
}

/* A child forked while the library's threads run (event pump, channel threads) can still use
 * the library: its allocator is fork-safe and the child opens its own connection to rnicd. */
static void check_fork(void)
{
	pid_t pid = fork();
	MUST(pid >= 0, "fork");
	if (pid == 0) {
		int n = 0;
		struct ibv_device **l = ibv_get_device_list(&n);
		int ok = l && n > 0;
		if (l)
			ibv_free_device_list(l);
		_exit(ok ? 0 : 1);
	}
	int st = 0;
	MUST(waitpid(pid, &st, 0) == pid, "waitpid");
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "a forked child lists the devices through the library");
}

/* A connected pair of RC QPs on `cq` (one device: internal loopback). */
static void rc_pair(struct ibv_cq *cq, struct ibv_qp **a, struct ibv_qp **b)
{
	*a = make_qp(cq, cq, NULL);
	*b = make_qp(cq, cq, NULL);
	MUST(*a && *b, "ibv_create_qp");
	MUST(connect_qp(*a, (*b)->qp_num, 7) == 0 && connect_qp(*b, (*a)->qp_num, 7) == 0,
	     "connect");
}

/* Posts `wr` on `qp` and waits for one completion on `cq` into `*wc`: its status, or
 * IBV_WC_GENERAL_ERR when the post fails or nothing completes. */
static enum ibv_wc_status post1(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_cq *cq,
				struct ibv_wc *wc)
{
	struct ibv_send_wr *bad;
	if (ibv_post_send(qp, wr, &bad) || poll_n(cq, wc, 1) != 1)
		return IBV_WC_GENERAL_ERR;
	return wc->status;
}

/* A signaled WRITE of 8 bytes from `src` (lkey `lkey`) to `raddr` with `rkey` on `qp`; its
 * completion status. */
static enum ibv_wc_status write8(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey,
				 uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 8, .lkey = lkey};
	struct ibv_send_wr wr = {.wr_id = 0x77, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = raddr, .rkey = rkey}};
	struct ibv_wc wc;
	return post1(qp, &wr, cq, &wc);
}

/* A type 2 window; `*key` is the key its next bind gives it (ibv_inc_rkey). */
static struct ibv_mw *must_mw2(uint32_t *key)
{
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	MUST(mw, "ibv_alloc_mw(IBV_MW_TYPE_2)");
	*key = ibv_inc_rkey(mw->rkey);
	return mw;
}

/* Memory windows as rdma-core's pyverbs tests (tests/test_mr.py MWTest, test_qpex.py) use
 * them, on the wire through internal loopback. */
static void check_memory_windows(void)
{
	struct ibv_cq *cq = must_cq(32, NULL, NULL);
	char *src = alloc_buf(4096), *dst = alloc_buf(16384);
	memset(src, 0x6b, 64);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(pd, dst, 16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	MUST(smr && mr, "ibv_reg_mr with IBV_ACCESS_MW_BIND");
	struct ibv_qp *a, *b;
	struct ibv_wc wc;
	uint64_t d = (uintptr_t)dst;

	errno = 0;
	CHECK(ibv_alloc_mw(pd, 3) == NULL && errno == EINVAL, "ibv_alloc_mw of type 3: EINVAL");
	/* Type 1: ibv_bind_mw, the peer writes with mw->rkey; unbinding (length 0) revokes. */
	rc_pair(cq, &a, &b);
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	MUST(mw1, "ibv_alloc_mw(IBV_MW_TYPE_1)");
	uint32_t before = mw1->rkey;
	struct ibv_mw_bind mb = {.wr_id = 5, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = {.mr = mr, .addr = d, .length = 4096,
					       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}};
	CHECK(ibv_bind_mw(b, mw1, &mb) == 0 && mw1->rkey != before &&
		      (mw1->rkey >> 8) == (before >> 8),
	      "ibv_bind_mw (type 1): a new key byte at once (%#x -> %#x)", before, mw1->rkey);
	CHECK(poll_n(cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
		      wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 5,
	      "the bind completes: IBV_WC_BIND_MW");
	CHECK(write8(a, cq, src, smr->lkey, d + 16, mw1->rkey) == IBV_WC_SUCCESS &&
		      dst[16] == 0x6b,
	      "a WRITE through the type 1 window");
	CHECK(ibv_dereg_mr(mr) == EINVAL, "ibv_dereg_mr with a window bound: EINVAL");
	mb.bind_info.length = 0;
	mb.bind_info.mw_access_flags = 0;
	CHECK(ibv_bind_mw(b, mw1, &mb) == 0 && poll_n(cq, &wc, 1) == 1 &&
		      wc.status == IBV_WC_SUCCESS,
	      "unbinding (length 0)");
	CHECK(write8(a, cq, src, smr->lkey, d + 32, mw1->rkey) == IBV_WC_REM_ACCESS_ERR &&
		      dst[32] == 0,
	      "after the unbind: IBV_WC_REM_ACCESS_ERR");
	CHECK(ibv_dealloc_mw(mw1) == 0, "ibv_dealloc_mw (type 1)");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* Type 2: IBV_WR_BIND_MW with ibv_inc_rkey; local invalidation revokes. */
	rc_pair(cq, &a, &b);
	uint32_t k2;
	struct ibv_mw *mw2 = must_mw2(&k2);
	struct ibv_send_wr bw = {.wr_id = 6, .opcode = IBV_WR_BIND_MW,
				 .send_flags = IBV_SEND_SIGNALED,
				 .bind_mw = {.mw = mw2, .rkey = k2,
					     .bind_info = {.mr = mr, .addr = d + 4096, .length = 4096,
							   .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}}},
			   *bad;
	CHECK(post1(b, &bw, cq, &wc) == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW,
	      "IBV_WR_BIND_MW (type 2)");
	CHECK(write8(a, cq, src, smr->lkey, d + 4096 + 8, k2) == IBV_WC_SUCCESS &&
		      dst[4096 + 8] == 0x6b,
	      "a WRITE through the type 2 window with its new key");
	struct ibv_send_wr inv = {.wr_id = 7, .opcode = IBV_WR_LOCAL_INV,
				  .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = k2};
	CHECK(post1(b, &inv, cq, &wc) == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
	      "IBV_WR_LOCAL_INV of the type 2 window");
	CHECK(write8(a, cq, src, smr->lkey, d + 4096 + 64, k2) == IBV_WC_REM_ACCESS_ERR &&
		      dst[4096 + 64] == 0,
	      "after the invalidation: IBV_WC_REM_ACCESS_ERR");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* Type 2, invalidated by the peer's SEND with invalidate. */
	/* The application tracks a type 2 window's key (the library leaves mw->rkey as it was
	 * allocated, as rdma-core does): the FREE window, still keyed k2, binds with the next. */
	rc_pair(cq, &a, &b);
	mw2->rkey = k2;
	k2 = ibv_inc_rkey(k2);
	bw.bind_mw.rkey = k2;
	bw.bind_mw.mw = mw2;
	CHECK(post1(b, &bw, cq, &wc) == IBV_WC_SUCCESS, "a FREE type 2 window binds again");
	char *rx = alloc_buf(4096);
	struct ibv_mr *rmr = must_reg(rx, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge rsge = {.addr = (uintptr_t)rx, .length = 64, .lkey = rmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 8, .sg_list = &rsge, .num_sge = 1}, *rbad;
	MUST(ibv_post_recv(b, &rwr, &rbad) == 0, "ibv_post_recv");
	struct ibv_sge ssge = {.addr = (uintptr_t)src, .length = 8, .lkey = smr->lkey};
	struct ibv_send_wr sinv = {.wr_id = 9, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED,
				   .invalidate_rkey = k2};
	struct ibv_wc w2[2];
	CHECK(ibv_post_send(a, &sinv, &bad) == 0 && poll_n(cq, w2, 2) == 2,
	      "IBV_WR_SEND_WITH_INV of the window: two completions");
	int recv_i = w2[0].opcode == IBV_WC_RECV ? 0 : 1;
	CHECK(w2[recv_i].status == IBV_WC_SUCCESS && (w2[recv_i].wc_flags & IBV_WC_WITH_INV) &&
		      w2[recv_i].invalidated_rkey == k2,
	      "the receive has IBV_WC_WITH_INV and the invalidated rkey %#x", k2);
	CHECK(write8(a, cq, src, smr->lkey, d + 4096 + 128, k2) == IBV_WC_REM_ACCESS_ERR,
	      "after the remote invalidation: IBV_WC_REM_ACCESS_ERR");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* The window's access counts, not the MR's (test_qp_ex_rc_bind_mw): the wr API binds a
	 * window with local write only, and a WRITE through it fails. Deallocating a bound
	 * window revokes it too. */
	struct ibv_qp_init_attr_ex xa =
		qp_ex_attr(cq, 8, 8, 1, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_BIND_MW);
	struct ibv_qp *bx = ibv_create_qp_ex(ctx, &xa);
	a = make_qp(cq, cq, NULL);
	MUST(a && bx, "ibv_create_qp_ex with IBV_QP_EX_WITH_BIND_MW");
	MUST(connect_qp(a, bx->qp_num, 7) == 0 && connect_qp(bx, a->qp_num, 7) == 0, "connect");
	uint32_t k3;
	struct ibv_mw *mw3 = must_mw2(&k3);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(bx);
	struct ibv_mw_bind_info bi = {.mr = mr, .addr = d + 8192, .length = 4096,
				      .mw_access_flags = IBV_ACCESS_LOCAL_WRITE};
	ibv_wr_start(x);
	x->wr_id = 10;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(x, mw3, k3, &bi);
	CHECK(ibv_wr_complete(x) == 0 && poll_n(cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
		      wc.opcode == IBV_WC_BIND_MW,
	      "ibv_wr_bind_mw");
	CHECK(write8(a, cq, src, smr->lkey, d + 8192, k3) == IBV_WC_REM_ACCESS_ERR &&
		      dst[8192] == 0,
	      "a window bound with local write only: a WRITE through it, IBV_WC_REM_ACCESS_ERR");
	ibv_destroy_qp(a);
	ibv_destroy_qp(bx);
	rc_pair(cq, &a, &b);
	uint32_t k4;
	struct ibv_mw *mw4 = must_mw2(&k4);
	bw.bind_mw.mw = mw4;
	bw.bind_mw.rkey = k4;
	CHECK(post1(b, &bw, cq, &wc) == IBV_WC_SUCCESS, "bind another type 2 window");
	CHECK(ibv_dealloc_mw(mw4) == 0, "ibv_dealloc_mw of the bound window");
	CHECK(write8(a, cq, src, smr->lkey, d + 4096, k4) == IBV_WC_REM_ACCESS_ERR,
	      "after ibv_dealloc_mw: IBV_WC_REM_ACCESS_ERR");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	/* Access bits a window may not have (MW_BIND): the bind's completion says so, as rxe
	 * answers, and the context goes on working (the post is not a protocol error). */
	rc_pair(cq, &a, &b);
	struct ibv_mw *mw5 = must_mw2(&bw.bind_mw.rkey);
	bw.bind_mw.mw = mw5;
	bw.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_MW_BIND;
	CHECK(post1(b, &bw, cq, &wc) == IBV_WC_MW_BIND_ERR,
	      "a bind with IBV_ACCESS_MW_BIND: IBV_WC_MW_BIND_ERR");
	struct ibv_pd *pd5 = ibv_alloc_pd(ctx);
	CHECK(pd5 && ibv_dealloc_pd(pd5) == 0, "the context works after a refused bind");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	CHECK(ibv_dealloc_mw(mw5) == 0, "the unbound window goes");
	CHECK(ibv_dealloc_mw(mw2) == 0 && ibv_dealloc_mw(mw3) == 0, "the windows go");
	CHECK(ibv_dereg_mr(mr) == 0, "the MR goes once no window is bound");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq);
	free(src);
	free(dst);
	free(rx);
}

/* ibv_resize_cq: a CQ made for 2 completions, grown to 64, takes 16 at once without
 * overflowing (its ring stays small: the rest waits in the engine's CQ); shrinking below
 * what it holds fails. */
static void check_resize_cq(void)
{
	struct ibv_cq *cq = must_cq(2, NULL, NULL);
	char *buf = alloc_buf(8192);
	struct ibv_mr *mr = must_reg(buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp *a, *b;
	connect_pair(cq, cq, 7, &a, &b);
	CHECK(ibv_resize_cq(cq, 64) == 0 && cq->cqe >= 64, "resized to %d", cq->cqe);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = (uintptr_t)buf + 4096, .rkey = mr->rkey}},
			   *bad;
	int posted = 0;
	for (int i = 0; i < 16; i++) {
		wr.wr_id = i;
		posted += ibv_post_send(a, &wr, &bad) == 0;
	}
	usleep(100000);
	CHECK(ibv_resize_cq(cq, 4) == EINVAL, "shrinking below the completions it holds: EINVAL");
	struct ibv_wc wc[16];
	int n = poll_n(cq, wc, 16), good = 0;
	for (int i = 0; i < n; i++)
		good += wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i;
	CHECK(posted == 16 && n == 16 && good == 16 && qp_state(a) == IBV_QPS_RTS,
	      "16 completions in order on the grown CQ, no overflow (%d of %d)", good, n);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	free(buf);
	CHECK(ibv_destroy_cq(cq) == 0, "destroy the resized CQ");
}

/* ibv_rereg_mr keeps the lkey and rkey (as mlx5 does), for a new translation, access or PD,
 * and the old translation is not reachable through them afterwards. */
static void check_rereg_keeps_keys(void)
{
	struct ibv_cq *cq = must_cq(16, NULL, NULL);
	char *src = alloc_buf(4096), *one = alloc_buf(8192), *two = alloc_buf(8192);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(pd, one, 8192,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	MUST(smr && mr, "ibv_reg_mr");
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	struct ibv_qp *a, *b;
	connect_pair(cq, cq, 7, &a, &b);
	memset(src, 0x3c, 64);
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 64, .lkey = smr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = (uintptr_t)two + 100, .rkey = rkey}};
	struct ibv_wc wc;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, two, 8192, 0) == 0,
	      "ibv_rereg_mr(CHANGE_TRANSLATION)");
	CHECK(mr->lkey == lkey && mr->rkey == rkey && mr->addr == two && mr->length == 8192,
	      "the MR keeps its keys (lkey %#x -> %#x, rkey %#x -> %#x) and shows its new range",
	      lkey, mr->lkey, rkey, mr->rkey);
	CHECK(post1(a, &wr, cq, &wc) == IBV_WC_SUCCESS,
	      "a WRITE with the same rkey to the new range");
	CHECK(two[100] == 0x3c && two[163] == 0x3c && one[100] == 0,
	      "it lands in the new memory, not the old");
	wr.wr.rdma.remote_addr = (uintptr_t)one + 100;
	wr.wr_id = 2;
	CHECK(post1(a, &wr, cq, &wc) == IBV_WC_REM_ACCESS_ERR && one[100] == 0,
	      "the old range is out of reach: IBV_WC_REM_ACCESS_ERR");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE) == 0 &&
		      mr->lkey == lkey,
	      "ibv_rereg_mr(CHANGE_ACCESS) keeps the lkey");
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	MUST(pd2, "ibv_alloc_pd");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && mr->pd == pd2 &&
		      mr->lkey == lkey,
	      "ibv_rereg_mr(CHANGE_PD) keeps the lkey");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "the MR now holds the new PD");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd2) == 0, "dereg, then the PD goes");
	ibv_dereg_mr(smr);
	ibv_destroy_cq(cq);
	free(src);
	free(one);
	free(two);
}

/* Registration of ordinary memory across contexts and after it: one buffer on two contexts
 * (multi-rail programs register it on each RNIC), objects of another context refused, and
 * once the last MR is gone the memory is ordinary again (realloc grows it with mremap,
 * MADV_DONTNEED drops its pages). */
static void check_registration_lifecycle(struct ibv_device *dev)
{
	struct ibv_context *ctx2 = ibv_open_device(dev);
	MUST(ctx2, "second ibv_open_device");
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx2);
	MUST(pd2, "ibv_alloc_pd on the second context");
	size_t len = 1 << 20;
	char *buf = malloc(len); /* above the mmap threshold: its own mapping */
	MUST(buf, "malloc");
	memset(buf, 0x5a, len);
	struct ibv_mr *m1 = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *m2 = ibv_reg_mr(pd2, buf + 4096, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m1 && m2, "one buffer registered on two contexts (%s)", m2 ? "both" : strerror(errno));
	struct ibv_cq *cq2 = ibv_create_cq(ctx2, 4, NULL, NULL, 0);
	struct ibv_cq *cq1 = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	MUST(cq1 && cq2, "ibv_create_cq on both contexts");
	struct ibv_qp_init_attr qa = {
		.send_cq = cq2,
		.recv_cq = cq1,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
	};
	errno = 0;
	CHECK(ibv_create_qp(pd, &qa) == NULL && errno == EINVAL,
	      "ibv_create_qp with a CQ of another context: EINVAL");
	CHECK(ibv_destroy_cq(cq1) == 0 && ibv_destroy_cq(cq2) == 0, "CQs destroyed");
	if (m2)
		CHECK(ibv_dereg_mr(m2) == 0, "dereg on the second context");
	if (m1)
		CHECK(ibv_dereg_mr(m1) == 0, "dereg on the first");
	CHECK(buf[0] == 0x5a && buf[len - 1] == 0x5a, "contents kept after the last dereg");
	/* Ordinary memory again: realloc moves or grows the block with mremap, and the grown
	 * part is usable (on the shared mapping it would fault past the memfd's end). */
	char *big = realloc(buf, 4 * len);
	MUST(big, "realloc");
	memset(big + len, 0x11, 3 * len);
	CHECK(big[len - 1] == 0x5a && big[4 * len - 1] == 0x11,
	      "realloc of a once-registered buffer grows it, contents kept");
	struct ibv_mr *m3 = ibv_reg_mr(pd, big, 4 * len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m3 != NULL, "the grown buffer registers again");
	if (m3)
		ibv_dereg_mr(m3);
	/* MADV_DONTNEED on private anonymous memory reads back zeroes. */
	char *page = (char *)(((uintptr_t)big + len + 4095) & ~(uintptr_t)4095);
	CHECK(madvise(page, 4096, MADV_DONTNEED) == 0 && page[0] == 0,
	      "MADV_DONTNEED after the last dereg drops the page, as on ordinary memory");
	free(big);
	CHECK(ibv_dealloc_pd(pd2) == 0 && ibv_close_device(ctx2) == 0, "second context closed");
}

/* A destroyed ID or channel used again (Debian's perftest 4.5-0.17 does it when it retries a
 * rejected connection) is EINVAL in ferroce's librdmacm, not a use after free. */
static void check_rdmacm_stale_handles(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "rdma_create_event_channel");
	struct rdma_cm_id *id = NULL;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0 && id, "rdma_create_id");
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	/* A new ID made at once does not make the old pointer live again (malloc would hand the
	 * freed block straight back). */
	struct rdma_cm_id *fresh = NULL;
	MUST(rdma_create_id(ch, &fresh, NULL, RDMA_PS_TCP) == 0 && fresh, "rdma_create_id");
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7471)};
	dst.sin_addr.s_addr = htonl(0x0a630002);
	errno = 0;
	int rc = rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000);
	CHECK(rc == -1 && errno == EINVAL, "rdma_resolve_addr on a destroyed ID: EINVAL (%d, %d)",
	      rc, errno);
	errno = 0;
	rc = rdma_destroy_id(id);
	CHECK(rc == -1 && errno == EINVAL, "rdma_destroy_id twice: EINVAL (%d, %d)", rc, errno);
	CHECK(rdma_destroy_id(fresh) == 0, "rdma_destroy_id of the new ID");
	rdma_destroy_event_channel(ch);
	struct rdma_cm_id *id2 = NULL;
	errno = 0;
	rc = rdma_create_id(ch, &id2, NULL, RDMA_PS_TCP);
	CHECK(rc == -1 && errno == EINVAL && !id2, "rdma_create_id on a destroyed channel: EINVAL");
	struct rdma_cm_event *ev = NULL;
	errno = 0;
	rc = rdma_get_cm_event(ch, &ev);
	CHECK(rc == -1 && errno == EINVAL, "rdma_get_cm_event on a destroyed channel: EINVAL");
	errno = 0;
	rdma_destroy_event_channel(ch);
	CHECK(errno == EINVAL, "rdma_destroy_event_channel twice: refused");
}

/* The next event on `ch` within `secs` seconds, or NULL. */
static struct rdma_cm_event *cm_event_within(struct rdma_event_channel *ch, int secs)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	if (poll(&p, 1, secs * 1000) <= 0)
		return NULL;
	struct rdma_cm_event *ev = NULL;
	return rdma_get_cm_event(ch, &ev) == 0 ? ev : NULL;
}

/* Checks that the next event on `ch` (within 5 s) is `want`, and acknowledges it. */
static void check_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
			const char *what)
{
	struct rdma_cm_event *ev = cm_event_within(ch, 5);
	CHECK(ev && ev->event == want, "%s (%s)", what,
	      ev ? rdma_event_str(ev->event) : "nothing in 5 s");
	if (ev)
		rdma_ack_cm_event(ev);
}

/* Acknowledges the events on `ch` up to and including the first `want` (5 s each at most). */
static void ack_until(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	while ((ev = cm_event_within(ch, 5))) {
		int last = ev->event == want;
		rdma_ack_cm_event(ev);
		if (last)
			break;
	}
}

/* A new ID on `ch` with its address and route to `to` resolved. */
static struct rdma_cm_id *resolved_id(struct rdma_event_channel *ch, struct sockaddr_in *to)
{
	struct rdma_cm_id *id = NULL;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
	MUST(rdma_resolve_addr(id, NULL, (struct sockaddr *)to, 2000) == 0, "rdma_resolve_addr");
	struct rdma_cm_event *ev = cm_event_within(ch, 5);
	MUST(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "ADDR_RESOLVED");
	rdma_ack_cm_event(ev);
	MUST(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	ev = cm_event_within(ch, 5);
	MUST(ev && ev->event == RDMA_CM_EVENT_ROUTE_RESOLVED, "ROUTE_RESOLVED");
	rdma_ack_cm_event(ev);
	return id;
}

/* rdma_resolve_addr waits for the next hop as the kernel's does (ARP): an address on the
 * subnet that nobody answers for ends in ADDR_ERROR within the timeout, not ADDR_RESOLVED
 * and a connect retrying its REQ for a minute and a half. */
static void check_rdmacm_addr_error(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "rdma_create_event_channel");
	struct rdma_cm_id *id = NULL;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_in nobody = {.sin_family = AF_INET, .sin_port = htons(7480)};
	nobody.sin_addr.s_addr = htonl(0x0a63004d); /* 10.99.0.77: on the link, no such host */
	MUST(rdma_resolve_addr(id, NULL, (struct sockaddr *)&nobody, 300) == 0,
	     "rdma_resolve_addr");
	struct rdma_cm_event *ev = cm_event_within(ch, 5);
	CHECK(ev && ev->event == RDMA_CM_EVENT_ADDR_ERROR &&
		      (ev->status == -ETIMEDOUT || ev->status == -EHOSTUNREACH),
	      "an unanswered address: ADDR_ERROR (%s, status %d)",
	      ev ? rdma_event_str(ev->event) : "nothing in 5 s", ev ? ev->status : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

/* rdma_create_qp with no CQ named makes them, as librdmacm's does (each with its own
 * completion channel, in the ID and in the caller's attributes), and rdma_destroy_qp
 * destroys them; a CQ the application names stays its own. */
static void check_rdmacm_qp_without_cqs(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "rdma_create_event_channel");
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7481)};
	addr.sin_addr.s_addr = htonl(0x0a630002); /* ferroce1, 10.99.0.2 */
	struct rdma_cm_id *id = resolved_id(ch, &addr);
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	int rc = rdma_create_qp(id, NULL, &qa);
	CHECK(rc == 0 && qa.send_cq && qa.recv_cq && qa.send_cq != qa.recv_cq &&
		      qa.send_cq == id->send_cq && qa.recv_cq == id->recv_cq &&
		      id->send_cq_channel && id->recv_cq_channel,
	      "rdma_create_qp without CQs makes them (%d, errno %d)", rc, errno);
	if (rc == 0) {
		rdma_destroy_qp(id);
		CHECK(!id->send_cq && !id->recv_cq && !id->send_cq_channel && !id->recv_cq_channel,
		      "rdma_destroy_qp destroys the CQs it made");
	}
	/* Only the receive CQ missing: the send CQ named is kept. */
	struct ibv_cq *mine = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	MUST(mine, "ibv_create_cq");
	struct ibv_qp_init_attr qb = qa;
	qb.send_cq = mine;
	qb.recv_cq = NULL;
	rc = rdma_create_qp(id, NULL, &qb);
	CHECK(rc == 0 && qb.send_cq == mine && qb.recv_cq && qb.recv_cq != mine,
	      "rdma_create_qp makes only the CQ not named (%d, errno %d)", rc, errno);
	if (rc == 0)
		rdma_destroy_qp(id);
	CHECK(ibv_destroy_cq(mine) == 0, "the application's CQ is still its own");
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

/* rdma_create_id with no channel makes a synchronous ID, whose resolve calls return once
 * resolved or fail with errno (librdmacm's rdma_create_id2); rdma_migrate_id moves an ID
 * with the events queued for it to another channel. */
static void check_rdmacm_sync_and_migrate(void)
{
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7482)};
	addr.sin_addr.s_addr = htonl(0x0a630002); /* ferroce1, 10.99.0.2 */
	struct sockaddr_in nobody = addr;
	nobody.sin_addr.s_addr = htonl(0x0a63004d); /* 10.99.0.77: nobody answers */
	struct rdma_cm_id *id = NULL;
	MUST(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0 && id->channel,
	     "rdma_create_id without a channel");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0 && id->verbs,
	      "a synchronous rdma_resolve_addr returns resolved");
	CHECK(rdma_resolve_route(id, 2000) == 0, "a synchronous rdma_resolve_route");
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id of a synchronous ID");
	MUST(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id without a channel");
	int rc = rdma_resolve_addr(id, NULL, (struct sockaddr *)&nobody, 300);
	CHECK(rc == -1 && (errno == ETIMEDOUT || errno == EHOSTUNREACH),
	      "a synchronous rdma_resolve_addr to nobody: -1, ETIMEDOUT (%d, %d)", rc, errno);
	rdma_destroy_id(id);

	struct rdma_event_channel *c1 = rdma_create_event_channel();
	struct rdma_event_channel *c2 = rdma_create_event_channel();
	MUST(c1 && c2, "rdma_create_event_channel");
	MUST(rdma_create_id(c1, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	MUST(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
	struct pollfd p = {.fd = c1->fd, .events = POLLIN};
	MUST(poll(&p, 1, 5000) == 1, "ADDR_RESOLVED queued on the first channel");
	CHECK(rdma_migrate_id(id, c2) == 0 && id->channel == c2, "rdma_migrate_id");
	struct rdma_cm_event *ev = cm_event_within(c2, 1);
	CHECK(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id,
	      "the queued event moved with the ID (%s)",
	      ev ? rdma_event_str(ev->event) : "nothing");
	if (ev)
		rdma_ack_cm_event(ev);
	/* (the old channel's eventfd may still count it: taking one there finds no event) */
	fcntl(c1->fd, F_SETFL, fcntl(c1->fd, F_GETFL) | O_NONBLOCK);
	struct rdma_cm_event *left = NULL;
	CHECK(rdma_get_cm_event(c1, &left) == -1 && errno == EAGAIN,
	      "no event left on the first channel");
	rdma_destroy_id(id);
	rdma_destroy_event_channel(c1);
	rdma_destroy_event_channel(c2);
}

/* Connects `cid` (its QP made from `pd` and `qa`) with `cp`; returns the request's ID as
 * the server listening on `sch` got it in CONNECT_REQUEST. */
static struct rdma_cm_id *requested(struct rdma_event_channel *sch, struct rdma_cm_id *cid,
				    struct ibv_pd *pd, struct ibv_qp_init_attr *qa,
				    struct rdma_conn_param *cp)
{
	MUST(rdma_create_qp(cid, pd, qa) == 0, "rdma_create_qp");
	MUST(rdma_connect(cid, cp) == 0, "rdma_connect");
	struct rdma_cm_event *ev = cm_event_within(sch, 5);
	MUST(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST");
	struct rdma_cm_id *child = ev->id;
	rdma_ack_cm_event(ev);
	return child;
}

/* A server that destroys a connect request's ID without answering it refuses it, as the
 * kernel's cm_destroy_id sends a REJ: the client hears REJECTED at once, not UNREACHABLE
 * after a minute of retries. */
static void check_rdmacm_destroy_rejects(void)
{
	struct rdma_event_channel *sch = rdma_create_event_channel();
	struct rdma_event_channel *cch = rdma_create_event_channel();
	MUST(sch && cch, "rdma_create_event_channel");
	struct rdma_cm_id *listen = NULL, *cid;
	MUST(rdma_create_id(sch, &listen, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (server)");
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7479)};
	addr.sin_addr.s_addr = htonl(0x0a630002); /* ferroce1, 10.99.0.2 */
	MUST(rdma_bind_addr(listen, (struct sockaddr *)&addr) == 0, "rdma_bind_addr");
	MUST(rdma_listen(listen, 4) == 0, "rdma_listen");
	cid = resolved_id(cch, &addr);
	struct rdma_cm_event *ev;
	struct ibv_pd *cpd = ibv_alloc_pd(cid->verbs);
	struct ibv_cq *ccq = ibv_create_cq(cid->verbs, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {.send_cq = ccq,
				      .recv_cq = ccq,
				      .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4,
					      .max_recv_wr = 4,
					      .max_send_sge = 1,
					      .max_recv_sge = 1}};
	MUST(cpd && ccq, "ibv_alloc_pd, ibv_create_cq");
	struct rdma_conn_param cp = {
		.responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7};
	struct rdma_cm_id *child = requested(sch, cid, cpd, &qa, &cp);
	CHECK(rdma_destroy_id(child) == 0, "rdma_destroy_id of a connect request's ID");
	check_event(cch, RDMA_CM_EVENT_REJECTED, "the client hears REJECTED at once");
	rdma_destroy_qp(cid);
	rdma_destroy_id(cid);

	/* A client that destroys its ID while its connect request is unanswered withdraws it
	 * (the kernel's cm_destroy_id sends a REJ): the server's request ID hears REJECTED at
	 * once instead of holding the request until the handshake times out. */
	cid = resolved_id(cch, &addr);
	child = requested(sch, cid, cpd, &qa, &cp);
	rdma_destroy_qp(cid);
	CHECK(rdma_destroy_id(cid) == 0, "rdma_destroy_id of a connecting ID");
	check_event(sch, RDMA_CM_EVENT_REJECTED, "the server's request ID hears REJECTED");
	rdma_destroy_id(child);

	/* rdma_accept(id, NULL) agrees to the depths the request asked for (1 and 1 here), not
	 * its own defaults (librdmacm's rdma_accept). */
	cid = resolved_id(cch, &addr);
	child = requested(sch, cid, cpd, &qa, &cp);
	struct ibv_pd *spd = ibv_alloc_pd(child->verbs);
	struct ibv_cq *scq = ibv_create_cq(child->verbs, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr sqa = qa;
	sqa.send_cq = sqa.recv_cq = scq;
	MUST(spd && scq && rdma_create_qp(child, spd, &sqa) == 0, "rdma_create_qp (server)");
	MUST(rdma_accept(child, NULL) == 0, "rdma_accept(id, NULL)");
	check_event(cch, RDMA_CM_EVENT_ESTABLISHED, "the client: ESTABLISHED");
	struct ibv_qp_attr sa;
	struct ibv_qp_init_attr si;
	CHECK(ibv_query_qp(child->qp, &sa, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC,
			   &si) == 0 &&
		      sa.max_rd_atomic == 1 && sa.max_dest_rd_atomic == 1,
	      "rdma_accept(id, NULL) took the request's depths: %u, %u", sa.max_rd_atomic,
	      sa.max_dest_rd_atomic);
	rdma_disconnect(cid);
	ack_until(sch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(child);
	rdma_destroy_id(child);
	rdma_destroy_qp(cid);
	rdma_destroy_id(cid);

	/* A client without a QP gets CONNECT_RESPONSE and finishes with rdma_establish, after
	 * which no ESTABLISHED comes (librdmacm's rdma_establish only sends the RTU); the
	 * server gets its ESTABLISHED. */
	cid = resolved_id(cch, &addr);
	/* Its own QP, outside rdma_cm: the connect names it (conn_param.qp_num). */
	struct ibv_qp *own = ibv_create_qp(cpd, &qa);
	MUST(own, "ibv_create_qp");
	struct rdma_conn_param own_cp = cp;
	own_cp.qp_num = own->qp_num;
	MUST(rdma_connect(cid, &own_cp) == 0, "rdma_connect without an rdma_cm QP");
	ev = cm_event_within(sch, 5);
	MUST(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST");
	child = ev->id;
	rdma_ack_cm_event(ev);
	MUST(rdma_create_qp(child, spd, &sqa) == 0, "rdma_create_qp (server)");
	MUST(rdma_accept(child, NULL) == 0, "rdma_accept");
	ev = cm_event_within(cch, 5);
	MUST(ev && ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE, "CONNECT_RESPONSE");
	rdma_ack_cm_event(ev);
	CHECK(rdma_establish(cid) == 0, "rdma_establish");
	check_event(sch, RDMA_CM_EVENT_ESTABLISHED, "the server: ESTABLISHED");
	struct pollfd quiet = {.fd = cch->fd, .events = POLLIN};
	CHECK(poll(&quiet, 1, 300) == 0, "no ESTABLISHED after CONNECT_RESPONSE + rdma_establish");
	rdma_disconnect(cid);
	ack_until(sch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(child);
	rdma_destroy_id(child);
	ibv_destroy_qp(own);
	rdma_destroy_id(cid);

	/* A listener destroyed while a connect request for it waits untaken: the request goes
	 * with it (never delivered, its ID never handed out) and the client is refused, as the
	 * kernel destroys a listener's pending children. */
	struct rdma_cm_id *l2 = NULL;
	MUST(rdma_create_id(sch, &l2, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener 2)");
	struct sockaddr_in addr2 = addr;
	addr2.sin_port = htons(7478);
	MUST(rdma_bind_addr(l2, (struct sockaddr *)&addr2) == 0, "rdma_bind_addr");
	MUST(rdma_listen(l2, 4) == 0, "rdma_listen");
	cid = resolved_id(cch, &addr2);
	MUST(rdma_create_qp(cid, cpd, &qa) == 0, "rdma_create_qp");
	MUST(rdma_connect(cid, &cp) == 0, "rdma_connect");
	struct pollfd req = {.fd = sch->fd, .events = POLLIN};
	MUST(poll(&req, 1, 5000) == 1, "the connect request is queued at the server");
	CHECK(rdma_destroy_id(l2) == 0, "rdma_destroy_id of a listener with a request queued");
	CHECK(poll(&req, 1, 300) == 0, "the destroyed listener's request is not delivered");
	check_event(cch, RDMA_CM_EVENT_REJECTED, "its client hears REJECTED");
	rdma_destroy_qp(cid);
	ibv_destroy_cq(scq);
	ibv_dealloc_pd(spd);
	ibv_destroy_cq(ccq);
	ibv_dealloc_pd(cpd);
	rdma_destroy_id(cid);
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
}

int main(int argc, char **argv)
{
	const char *name = NULL;
	int opt;
	while ((opt = getopt(argc, argv, "d:g:")) != -1) {
		switch (opt) {
		case 'd':
			name = optarg;
			break;
		case 'g':
			gid_index = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [-d DEVICE] [-g GID_INDEX]\n", argv[0]);
			return 2;
		}
	}
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n > 0, "ibv_get_device_list: no devices");
	struct ibv_device *dev = list[0];
	for (int i = 0; name && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			dev = list[i];
	MUST(!name || !strcmp(ibv_get_device_name(dev), name), "no such device");
	ctx = ibv_open_device(dev);
	MUST(ctx, "ibv_open_device");
	MUST(ibv_query_gid(ctx, 1, gid_index, &gid) == 0, "ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	MUST(pd, "ibv_alloc_pd");

	check_device();
	check_unsupported();
	check_state_errors();
	check_completion_errors();
	check_cq_overflow();
	check_busy();
	check_event_acks();
	check_async_acks();
	check_solicited();
	check_fork();
	check_bad_arguments();
	check_extended();
	check_ud_reply();
	check_compat_query_port();
	check_wr_threads();
	check_memory_windows();
	check_resize_cq();
	check_rereg_keeps_keys();
	check_registration_lifecycle(dev);
	check_rdmacm_stale_handles();
	check_rdmacm_destroy_rejects();
	check_rdmacm_addr_error();
	check_rdmacm_qp_without_cqs();
	check_rdmacm_sync_and_migrate();
	ibv_free_device_list(list);

	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("%d failure(s)\n", failures);
	return failures ? 1 : 0;
}
