/*
 * reg_churn: a libibverbs program (built against the installed <infiniband/verbs.h>, run
 * under ferroce-run) that registers, re-registers and deregisters memory as fast as it can,
 * moves data through what it registered (RDMA WRITE between two RC QPs of one device, internal
 * loopback), and now and then creates and destroys CQs, QPs and PDs. It runs until killed:
 * tools/tests/ibverbs.rs kills it with SIGKILL at random moments, most of them inside a
 * registration (ferroce's library moves the pages onto a memfd and tells rnicd), and checks
 * that rnicd reclaims everything and that other clients go on.
 *
 * usage: reg_churn -d DEVICE -p PHASE_FILE [-s SEED]
 * PHASE_FILE (created, 4096 bytes, shared) holds three 64-bit words the test reads after the
 * kill: the call in progress (enum phase), iterations done, registrations done.
 * Prints "ready" once the first registration worked. Every check that fails prints "FAIL ..."
 * and exits 1: the contents of memory must survive every move onto and off the memfd.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>

enum phase {
	P_IDLE = 0,
	P_REG = 1,
	P_REREG = 2,
	P_DEREG = 3,
	P_WRITE = 4,
	P_OBJECTS = 5,
};

#define SLOTS 6
#define MAX_PAGES 512 /* 2 MiB */

static volatile uint64_t *shared; /* [0] phase, [1] iterations, [2] registrations */
static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64*: a seeded, repeatable sequence */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static void fail(const char *what)
{
	printf("FAIL %s (errno %d: %s)\n", what, errno, strerror(errno));
	fflush(stdout);
	exit(1);
}

#define MUST(cond, what)                                                                   \
	do {                                                                               \
		if (!(cond))                                                               \
			fail(what);                                                        \
	} while (0)

static void set_phase(enum phase p)
{
	__atomic_store_n(&shared[0], (uint64_t)p, __ATOMIC_SEQ_CST);
}

struct slot {
	unsigned char *buf; /* mmap'd or aligned_alloc'd, whole pages */
	size_t len;
	int mapped;
	uint8_t seed; /* the pattern its bytes hold */
	struct ibv_mr *mr;
};

static void fill(unsigned char *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i += 512)
		p[i] = (uint8_t)(seed + i / 512);
	p[n - 1] = seed ^ 0x5a;
}

static int holds(const unsigned char *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i += 512)
		if (p[i] != (uint8_t)(seed + i / 512))
			return 0;
	return p[n - 1] == (uint8_t)(seed ^ 0x5a);
}

static void new_buffer(struct slot *s)
{
	s->len = (1 + rnd() % MAX_PAGES) * 4096;
	s->mapped = rnd() & 1;
	if (s->mapped) {
		s->buf = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			      0);
		MUST(s->buf != MAP_FAILED, "mmap");
	} else {
		s->buf = aligned_alloc(4096, s->len);
		MUST(s->buf, "aligned_alloc");
	}
	s->seed = (uint8_t)rnd();
	fill(s->buf, s->len, s->seed);
}

static void free_buffer(struct slot *s)
{
	MUST(holds(s->buf, s->len, s->seed), "memory changed across its registration");
	if (s->mapped)
		munmap(s->buf, s->len);
	else
		free(s->buf);
	s->buf = NULL;
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;
static union ibv_gid gid;

static struct ibv_qp *make_qp(void)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

static int connect_qp(struct ibv_qp *qp, uint32_t remote)
{
	struct ibv_qp_attr i = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	if (ibv_modify_qp(qp, &i,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_4096,
		.dest_qp_num = remote,
		.rq_psn = 1,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 1,
		.ah_attr = {.is_global = 1, .port_num = 1,
			    .grh = {.dgid = gid, .sgid_index = 1, .hop_limit = 64}},
	};
	if (ibv_modify_qp(qp, &r,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	struct ibv_qp_attr s = {
		.qp_state = IBV_QPS_RTS,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.sq_psn = 1,
		.max_rd_atomic = 1,
	};
	return ibv_modify_qp(qp, &s,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void connect_pair(void)
{
	qa = make_qp();
	qb = make_qp();
	MUST(qa && qb, "ibv_create_qp");
	MUST(connect_qp(qa, qb->qp_num) == 0 && connect_qp(qb, qa->qp_num) == 0, "connect");
}

static int reg(struct slot *s)
{
	set_phase(P_REG);
	s->mr = ibv_reg_mr(pd, s->buf, s->len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	set_phase(P_IDLE);
	if (!s->mr)
		return -1;
	shared[2]++;
	MUST(holds(s->buf, s->len, s->seed), "memory changed by ibv_reg_mr");
	return 0;
}

/* RDMA WRITE of the first bytes of `from` over the start of `to`, then both checked. */
static void write_between(struct slot *from, struct slot *to)
{
	size_t n = from->len < to->len ? from->len : to->len;
	if (n > 65536)
		n = 65536;
	struct ibv_sge sge = {
		.addr = (uintptr_t)from->buf, .length = (uint32_t)n, .lkey = from->mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr = {.rdma = {.remote_addr = (uintptr_t)to->buf, .rkey = to->mr->rkey}},
	}, *bad;
	set_phase(P_WRITE);
	MUST(ibv_post_send(qa, &wr, &bad) == 0, "ibv_post_send");
	struct ibv_wc wc;
	int got;
	long spins = 0;
	while ((got = ibv_poll_cq(cq, 1, &wc)) == 0) {
		if (++spins % 1024 == 0)
			usleep(50);
		MUST(spins < 100000000L, "the WRITE never completed");
	}
	set_phase(P_IDLE);
	MUST(got == 1 && wc.status == IBV_WC_SUCCESS, "the WRITE failed");
	/* `to` now holds `from`'s pattern over the first n bytes: make it one pattern again. */
	if (!holds(from->buf, from->len, from->seed))
		fail("the WRITE's source changed");
	for (size_t i = 0; i < n; i += 512)
		if (to->buf[i] != from->buf[i])
			fail("the WRITE's data did not arrive");
	fill(to->buf, to->len, to->seed);
}

int main(int argc, char **argv)
{
	const char *name = NULL, *phase_file = NULL;
	rng_state = 1;
	int c;
	while ((c = getopt(argc, argv, "d:p:s:")) != -1) {
		switch (c) {
		case 'd':
			name = optarg;
			break;
		case 'p':
			phase_file = optarg;
			break;
		case 's':
			rng_state = strtoull(optarg, NULL, 0) | 1;
			break;
		default:
			fprintf(stderr, "usage: %s -d DEVICE -p PHASE_FILE [-s SEED]\n", argv[0]);
			return 2;
		}
	}
	if (!name || !phase_file) {
		fprintf(stderr, "usage: %s -d DEVICE -p PHASE_FILE [-s SEED]\n", argv[0]);
		return 2;
	}
	int fd = open(phase_file, O_RDWR | O_CREAT | O_TRUNC, 0600);
	MUST(fd >= 0 && ftruncate(fd, 4096) == 0, "the phase file");
	shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	MUST(shared != MAP_FAILED, "mmap of the phase file");

	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n > 0, "ibv_get_device_list");
	struct ibv_device *dev = NULL;
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			dev = list[i];
	MUST(dev, "no such device");
	ctx = ibv_open_device(dev);
	MUST(ctx, "ibv_open_device");
	MUST(ibv_query_gid(ctx, 1, 1, &gid) == 0, "ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	MUST(pd && cq, "ibv_alloc_pd / ibv_create_cq");
	connect_pair();

	struct slot slots[SLOTS] = {0};
	int ready = 0;
	for (;;) {
		struct slot *s = &slots[rnd() % SLOTS];
		uint64_t what = rnd() % 16;
		if (!s->mr) {
			/* An empty slot: a new buffer, registered. */
			new_buffer(s);
			MUST(reg(s) == 0, "ibv_reg_mr");
			if (!ready) {
				printf("ready\n");
				fflush(stdout);
				ready = 1;
			}
		} else if (what < 5) {
			set_phase(P_DEREG);
			MUST(ibv_dereg_mr(s->mr) == 0, "ibv_dereg_mr");
			set_phase(P_IDLE);
			s->mr = NULL;
			free_buffer(s);
		} else if (what < 8) {
			/* Re-registered onto a new buffer (a new translation). */
			struct slot t = *s;
			new_buffer(&t);
			set_phase(P_REREG);
			int e = ibv_rereg_mr(s->mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, t.buf,
					     t.len, 0);
			set_phase(P_IDLE);
			MUST(e == 0, "ibv_rereg_mr");
			shared[2]++;
			free_buffer(s);
			t.mr = s->mr;
			*s = t;
			MUST(holds(s->buf, s->len, s->seed), "memory changed by ibv_rereg_mr");
		} else if (what < 14) {
			struct slot *t = &slots[rnd() % SLOTS];
			if (t != s && t->mr)
				write_between(s, t);
		} else {
			/* Objects come and go too: a QP pair and a CQ of their own. */
			set_phase(P_OBJECTS);
			struct ibv_cq *extra = ibv_create_cq(ctx, 16, NULL, NULL, 0);
			MUST(extra, "ibv_create_cq");
			MUST(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0, "ibv_destroy_qp");
			connect_pair();
			MUST(ibv_destroy_cq(extra) == 0, "ibv_destroy_cq");
			set_phase(P_IDLE);
		}
		shared[1]++;
	}
}
