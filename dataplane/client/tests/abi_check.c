/* Prints the size and field offsets of every struct of ferroce.h, for tests/abi.rs. */
#include <stddef.h>
#include <stdio.h>

#include "ferroce.h"

#define S(t) printf("%s size %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	S(ferroce_device_attr); O(ferroce_device_attr, max_mr_size); O(ferroce_device_attr, max_qp);
	O(ferroce_device_attr, max_inline_data); O(ferroce_device_attr, atomic_cap);
	S(ferroce_port_attr); O(ferroce_port_attr, link_layer);
	S(ferroce_mr); O(ferroce_mr, lkey); O(ferroce_mr, rkey);
	S(ferroce_srq_attr); O(ferroce_srq_attr, srq_limit);
	S(ferroce_qp_cap); O(ferroce_qp_cap, max_inline_data);
	S(ferroce_qp_init_attr); O(ferroce_qp_init_attr, qp_type); O(ferroce_qp_init_attr, cap);
	O(ferroce_qp_init_attr, sq_sig_all);
	S(ferroce_ah_attr); O(ferroce_ah_attr, flow_label); O(ferroce_ah_attr, sl);
	O(ferroce_ah_attr, dmac); O(ferroce_ah_attr, has_dmac);
	S(ferroce_qp_attr); O(ferroce_qp_attr, dest_qp_num); O(ferroce_qp_attr, ah_attr);
	O(ferroce_qp_attr, pkey_index); O(ferroce_qp_attr, rnr_retry);
	O(ferroce_qp_attr, en_sqd_async_notify); O(ferroce_qp_attr, cap);
	S(ferroce_sge); O(ferroce_sge, lkey);
	S(ferroce_send_wr); O(ferroce_send_wr, sg_list); O(ferroce_send_wr, num_sge);
	O(ferroce_send_wr, imm_data); O(ferroce_send_wr, remote_addr); O(ferroce_send_wr, rkey);
	O(ferroce_send_wr, compare_add); O(ferroce_send_wr, swap); O(ferroce_send_wr, ah);
	O(ferroce_send_wr, remote_qpn); O(ferroce_send_wr, remote_qkey);
	S(ferroce_recv_wr); O(ferroce_recv_wr, sg_list); O(ferroce_recv_wr, num_sge);
	S(ferroce_wc); O(ferroce_wc, status); O(ferroce_wc, qp_num); O(ferroce_wc, wc_flags);
	O(ferroce_wc, pkey_index); O(ferroce_wc, sl); O(ferroce_wc, solicited);
	S(ferroce_async_event); O(ferroce_async_event, element);
	return 0;
}
