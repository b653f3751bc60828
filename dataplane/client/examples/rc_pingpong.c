/*
 * rc_pingpong: an RC SEND ping-pong between two processes, each on an RNIC of rnicd, in the
 * manner of rdma-core's ibv_rc_pingpong - written against ferroce.h only.
 *
 *   server: rc_pingpong [-S SOCKET] [-d ferroce0] [-p PORT] [-s SIZE] [-n ITERS] [-e]
 *   client: rc_pingpong [-S SOCKET] [-d ferroce1] [-p PORT] [-s SIZE] [-n ITERS] [-e] HOST
 *
 * The two sides exchange QPN, PSN, GID and their buffer's address and rkey over TCP, bring
 * their QPs to RTS and bounce a message ITERS times; every message carries a pattern of its
 * iteration that the receiver checks. Then the client RDMA-WRITEs a pattern into the
 * server's buffer and READs it back. -e waits for completions on the CQ's completion
 * channel (poll(2) on its fd) instead of busy polling. The buffer is ordinary malloc'd
 * memory, registered in place.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "ferroce.h"

struct dest {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	uint8_t gid[16];
};

static struct ferroce_context *ctx;
static uint32_t cq, qpn;
static int use_events;

static void die(const char *what, int err)
{
	fprintf(stderr, "rc_pingpong: %s: %s (%s)\n", what, strerror(err),
		ctx ? ferroce_last_error(ctx) : ferroce_open_error());
	exit(1);
}

static int exchange(const char *host, int port, const struct dest *mine, struct dest *theirs)
{
	char msg[128], gid[33];
	int fd = -1;
	for (int i = 0; i < 16; i++)
		sprintf(gid + 2 * i, "%02x", mine->gid[i]);
	snprintf(msg, sizeof msg, "%06x:%06x:%08x:%016llx:%s", mine->qpn, mine->psn, mine->rkey,
		 (unsigned long long)mine->addr, gid);
	if (host) {
		struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
		char p[16];
		snprintf(p, sizeof p, "%d", port);
		if (getaddrinfo(host, p, &hints, &res))
			return -1;
		for (int tries = 0; tries < 100; tries++) {
			fd = socket(AF_INET, SOCK_STREAM, 0);
			if (connect(fd, res->ai_addr, res->ai_addrlen) == 0)
				break;
			close(fd);
			fd = -1;
			usleep(100000);
		}
		freeaddrinfo(res);
	} else {
		int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
			return -1;
		fd = accept(l, NULL, NULL);
		close(l);
	}
	if (fd < 0)
		return -1;
	size_t n = strlen(msg) + 1, got = 0;
	if (write(fd, msg, n) != (ssize_t)n)
		return -1;
	char in[128];
	while (got < n) {
		ssize_t r = read(fd, in + got, n - got);
		if (r <= 0)
			return -1;
		got += r;
	}
	unsigned long long addr;
	char g[33];
	if (sscanf(in, "%x:%x:%x:%llx:%32s", &theirs->qpn, &theirs->psn, &theirs->rkey, &addr, g) != 5)
		return -1;
	theirs->addr = addr;
	for (int i = 0; i < 16; i++)
		sscanf(g + 2 * i, "%2hhx", &theirs->gid[i]);
	/* Keep the connection until both sides are done, as a barrier at the end. */
	return fd;
}

/* Waits for one completion and returns it. */
static struct ferroce_wc wait_one(void)
{
	struct ferroce_wc wc;
	for (;;) {
		int n = ferroce_poll_cq(ctx, cq, 1, &wc);
		if (n < 0)
			die("poll_cq", -n);
		if (n == 1) {
			if (wc.status != FERROCE_WC_SUCCESS) {
				fprintf(stderr, "rc_pingpong: completion with status %u (wr %llu)\n",
					wc.status, (unsigned long long)wc.wr_id);
				exit(1);
			}
			return wc;
		}
		if (use_events) {
			int err = ferroce_req_notify_cq(ctx, cq, 0);
			if (err)
				die("req_notify_cq", err);
			/* A completion may have arrived before arming: poll once more. */
			n = ferroce_poll_cq(ctx, cq, 1, &wc);
			if (n == 1) {
				if (wc.status != FERROCE_WC_SUCCESS) {
					fprintf(stderr, "rc_pingpong: status %u\n", wc.status);
					exit(1);
				}
				return wc;
			}
			struct pollfd p = {.fd = ferroce_cq_event_fd(ctx, cq), .events = POLLIN};
			if (poll(&p, 1, 10000) != 1)
				die("waiting for a completion event", ETIMEDOUT);
			err = ferroce_get_cq_event(ctx, cq, 0);
			if (err)
				die("get_cq_event", err);
		}
	}
}

static void fill(uint8_t *b, size_t n, uint32_t iter)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(iter * 7 + i * 13);
}

static int check(const uint8_t *b, size_t n, uint32_t iter)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (uint8_t)(iter * 7 + i * 13))
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	const char *sock = NULL, *dev = NULL, *host = NULL;
	int port = 18515, opt, err;
	size_t size = 4096;
	uint32_t iters = 1000;
	while ((opt = getopt(argc, argv, "S:d:p:s:n:e")) != -1) {
		switch (opt) {
		case 'S': sock = optarg; break;
		case 'd': dev = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 's': size = strtoul(optarg, NULL, 0); break;
		case 'n': iters = strtoul(optarg, NULL, 0); break;
		case 'e': use_events = 1; break;
		default:
			fprintf(stderr, "usage: rc_pingpong [-S socket] [-d device] [-p port] [-s size] "
					"[-n iters] [-e] [host]\n");
			return 2;
		}
	}
	if (optind < argc)
		host = argv[optind];
	if (size < 8 || size > (1 << 20)) {
		fprintf(stderr, "rc_pingpong: -s must be 8..1048576\n");
		return 2;
	}

	ctx = ferroce_open(sock, dev);
	if (!ctx)
		die("open", errno);
	struct ferroce_port_attr port_attr;
	if ((err = ferroce_query_port(ctx, &port_attr)))
		die("query_port", err);
	uint32_t pd;
	if ((err = ferroce_alloc_pd(ctx, &pd)))
		die("alloc_pd", err);
	/* Two halves: [0, size) receives and sends the ping-pong, [size, 2 size) is the
	 * RDMA target. Ordinary heap memory, registered in place. */
	uint8_t *buf = malloc(2 * size);
	if (!buf)
		die("malloc", ENOMEM);
	memset(buf, 0, 2 * size);
	struct ferroce_mr mr;
	if ((err = ferroce_reg_mr(ctx, pd, buf, 2 * size,
				  FERROCE_ACCESS_LOCAL_WRITE | FERROCE_ACCESS_REMOTE_WRITE |
					  FERROCE_ACCESS_REMOTE_READ,
				  &mr)))
		die("reg_mr", err);
	if ((err = ferroce_create_cq(ctx, 64, &cq)))
		die("create_cq", err);
	struct ferroce_qp_init_attr init = {
		.pd = pd, .send_cq = cq, .recv_cq = cq, .qp_type = FERROCE_QPT_RC,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
	};
	if ((err = ferroce_create_qp(ctx, &init, &qpn)))
		die("create_qp", err);
	struct ferroce_qp_attr a = {
		.qp_state = FERROCE_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = FERROCE_ACCESS_LOCAL_WRITE | FERROCE_ACCESS_REMOTE_WRITE |
				   FERROCE_ACCESS_REMOTE_READ,
	};
	if ((err = ferroce_modify_qp(ctx, qpn, &a,
				     FERROCE_QP_STATE | FERROCE_QP_PKEY_INDEX | FERROCE_QP_PORT |
					     FERROCE_QP_ACCESS_FLAGS)))
		die("modify_qp INIT", err);

	struct dest mine = {.qpn = qpn, .psn = (uint32_t)(getpid() * 1103515245u) & 0xffffff,
			    .rkey = mr.rkey, .addr = mr.addr + size},
		    theirs;
	if ((err = ferroce_query_gid(ctx, 1, mine.gid)))
		die("query_gid", err);
	int tcp = exchange(host, port, &mine, &theirs);
	if (tcp < 0)
		die("TCP exchange", errno ? errno : EPROTO);

	struct ferroce_sge rsge = {.addr = (uint64_t)(uintptr_t)buf, .length = size, .lkey = mr.lkey};
	struct ferroce_recv_wr rwr = {.wr_id = 1, .sg_list = &rsge, .num_sge = 1};
	if ((err = ferroce_post_recv(ctx, qpn, &rwr)))
		die("post_recv", err);

	memset(&a, 0, sizeof a);
	a.qp_state = FERROCE_QPS_RTR;
	a.path_mtu = port_attr.active_mtu;
	a.dest_qp_num = theirs.qpn;
	a.rq_psn = theirs.psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	memcpy(a.ah_attr.dgid, theirs.gid, 16);
	a.ah_attr.sgid_index = 1;
	a.ah_attr.hop_limit = 64;
	if ((err = ferroce_modify_qp(ctx, qpn, &a,
				     FERROCE_QP_STATE | FERROCE_QP_AV | FERROCE_QP_PATH_MTU |
					     FERROCE_QP_DEST_QPN | FERROCE_QP_RQ_PSN |
					     FERROCE_QP_MAX_DEST_RD_ATOMIC | FERROCE_QP_MIN_RNR_TIMER)))
		die("modify_qp RTR", err);
	a.qp_state = FERROCE_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = mine.psn;
	a.max_rd_atomic = 1;
	if ((err = ferroce_modify_qp(ctx, qpn, &a,
				     FERROCE_QP_STATE | FERROCE_QP_TIMEOUT | FERROCE_QP_RETRY_CNT |
					     FERROCE_QP_RNR_RETRY | FERROCE_QP_SQ_PSN |
					     FERROCE_QP_MAX_QP_RD_ATOMIC)))
		die("modify_qp RTS", err);
	/* Both QPs are ready before the first SEND: a one-byte barrier. */
	char token = 'r';
	if (write(tcp, &token, 1) != 1 || read(tcp, &token, 1) != 1)
		die("TCP barrier", EPROTO);

	struct ferroce_sge ssge = {.addr = (uint64_t)(uintptr_t)buf, .length = size, .lkey = mr.lkey};
	struct ferroce_send_wr swr = {.wr_id = 2, .sg_list = &ssge, .num_sge = 1,
				      .opcode = FERROCE_WR_SEND, .send_flags = FERROCE_SEND_SIGNALED};
	struct timeval t0, t1;
	gettimeofday(&t0, NULL);
	uint32_t verified = 0;
	for (uint32_t i = 0; i < iters; i++) {
		int my_turn = (host != NULL);
		for (int step = 0; step < 2; step++, my_turn = !my_turn) {
			if (my_turn) {
				fill(buf, size, i);
				if ((err = ferroce_post_send(ctx, qpn, &swr)))
					die("post_send", err);
				struct ferroce_wc wc = wait_one();
				if (wc.opcode != FERROCE_WC_OP_SEND)
					die("expected a send completion", EPROTO);
			} else {
				struct ferroce_wc wc = wait_one();
				if (wc.opcode != FERROCE_WC_OP_RECV || wc.byte_len != size)
					die("expected a receive", EPROTO);
				if (!check(buf, size, i)) {
					fprintf(stderr, "rc_pingpong: message %u corrupted\n", i);
					return 1;
				}
				verified++;
				if ((err = ferroce_post_recv(ctx, qpn, &rwr)))
					die("post_recv", err);
			}
		}
	}
	gettimeofday(&t1, NULL);
	double usec = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_usec - t0.tv_usec);

	/* The client WRITEs a pattern into the server's second half and READs it back. */
	if (host) {
		fill(buf + size, size, 0xabcd);
		struct ferroce_sge w = {.addr = (uint64_t)(uintptr_t)(buf + size), .length = size,
					.lkey = mr.lkey};
		struct ferroce_send_wr wr = {.wr_id = 3, .sg_list = &w, .num_sge = 1,
					     .opcode = FERROCE_WR_RDMA_WRITE,
					     .send_flags = FERROCE_SEND_SIGNALED,
					     .remote_addr = theirs.addr, .rkey = theirs.rkey};
		if ((err = ferroce_post_send(ctx, qpn, &wr)))
			die("post_send WRITE", err);
		wait_one();
		memset(buf + size, 0, size);
		wr.opcode = FERROCE_WR_RDMA_READ;
		wr.wr_id = 4;
		if ((err = ferroce_post_send(ctx, qpn, &wr)))
			die("post_send READ", err);
		wait_one();
		if (!check(buf + size, size, 0xabcd)) {
			fprintf(stderr, "rc_pingpong: RDMA READ returned other bytes\n");
			return 1;
		}
	}
	/* Barrier: the server checks the WRITE after the client is done. */
	if (write(tcp, &token, 1) != 1 || read(tcp, &token, 1) != 1)
		die("TCP barrier", EPROTO);
	if (!host && !check(buf + size, size, 0xabcd)) {
		fprintf(stderr, "rc_pingpong: the client's RDMA WRITE did not arrive\n");
		return 1;
	}
	close(tcp);
	printf("%zu bytes in %.2f seconds = %.2f Mbit/sec\n", (size_t)2 * size * iters, usec / 1e6,
	       2.0 * size * iters * 8 / usec);
	printf("%u iters in %.2f seconds = %.2f usec/iter\n", iters, usec / 1e6, usec / iters);
	printf("verified %u messages%s\n", verified, host ? ", RDMA WRITE and READ" : ", RDMA WRITE");

	if ((err = ferroce_destroy_qp(ctx, qpn)) || (err = ferroce_dereg_mr(ctx, &mr)) ||
	    (err = ferroce_destroy_cq(ctx, cq)) || (err = ferroce_dealloc_pd(ctx, pd)))
		die("teardown", err);
	ferroce_close(ctx);
	free(buf);
	return 0;
}
