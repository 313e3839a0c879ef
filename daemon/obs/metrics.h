/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - GET /metrics in the Prometheus text format, served by
 * libmicrohttpd on its own thread. That thread only reads the segment
 * (relaxed atomic loads through kvshm_snap_take), so it needs no lock with
 * the main thread, the segment's single writer.
 */
#ifndef KVD_METRICS_H
#define KVD_METRICS_H

#include <stdint.h>
#include <sys/socket.h>

#include "../../shm/segment.h"

struct kvd_metrics;

/*
 * Serve on addr (from kvd_parse_listen). *port_out gets the bound port
 * (useful with port 0). Returns NULL after logging why.
 */
struct kvd_metrics *kvd_metrics_start(const struct kvshm_header *h,
				      const struct sockaddr *addr, uint16_t *port_out);
void kvd_metrics_stop(struct kvd_metrics *m);

#endif
