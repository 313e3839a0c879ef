// SPDX-License-Identifier: MIT
/*
 * metrics.c - the /metrics endpoint (see metrics.h). One snapshot per
 * request, rendered by the same code as `kvstat --prometheus`.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../shm/stats.h"
#include "../util/log.h"
#include "metrics.h"

struct kvd_metrics {
	struct MHD_Daemon *mhd;
	const struct kvshm_header *h;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int code,
			     const char *type, char *body, size_t len)
{
	struct MHD_Response *r;
	enum MHD_Result rc;

	r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	rc = MHD_queue_response(conn, code, r);
	MHD_destroy_response(r);
	return rc;
}

static enum MHD_Result text(struct MHD_Connection *conn, unsigned int code, const char *msg)
{
	char *b = strdup(msg);

	return b ? reply(conn, code, "text/plain; charset=utf-8", b, strlen(b)) : MHD_NO;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **con_cls)
{
	struct kvd_metrics *m = cls;
	struct kvshm_snap s;
	size_t need;
	char *buf;

	(void)version;
	(void)upload;
	(void)con_cls;
	if (*upload_size)
		return text(conn, MHD_HTTP_BAD_REQUEST, "no request body expected\n");
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
	if (strcmp(url, "/metrics"))
		return text(conn, MHD_HTTP_NOT_FOUND, "kvcached serves /metrics\n");
	if (kvshm_snap_take(m->h, &s))
		return text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
	need = kvshm_prometheus(&s, NULL, 0);
	buf = malloc(need + 1);
	if (!buf) {
		kvshm_snap_free(&s);
		return text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
	}
	kvshm_prometheus(&s, buf, need + 1);
	kvshm_snap_free(&s);
	return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", buf, need);
}

/*
 * Bind and listen ourselves, so that a port in use is our own message
 * naming the address, before the daemon says it is ready (libmicrohttpd
 * would only log "Failed to bind to port 0"). Returns the fd or -1.
 */
static int listen_on(const struct sockaddr *addr)
{
	bool v6 = addr->sa_family == AF_INET6;
	socklen_t len = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	char ip[INET6_ADDRSTRLEN] = "?";
	int fd, one = 1;
	uint16_t port;

	inet_ntop(addr->sa_family,
		  v6 ? (const void *)&((const struct sockaddr_in6 *)addr)->sin6_addr
		     : (const void *)&((const struct sockaddr_in *)addr)->sin_addr,
		  ip, sizeof(ip));
	port = ntohs(v6 ? ((const struct sockaddr_in6 *)addr)->sin6_port
			: ((const struct sockaddr_in *)addr)->sin_port);
	fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, addr, len) || listen(fd, 64)) {
		kvd_err("metrics-listen %s%s%s:%u: cannot listen there: %s%s", v6 ? "[" : "", ip,
			v6 ? "]" : "", (unsigned)port, strerror(errno),
			errno == EADDRINUSE ? " (another program serves that port; choose another, or port 0 for any free one)" : "");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

struct kvd_metrics *kvd_metrics_start(const struct kvshm_header *h,
				      const struct sockaddr *addr, uint16_t *port_out)
{
	struct kvd_metrics *m = calloc(1, sizeof(*m));
	unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
	struct sockaddr_storage got;
	socklen_t glen = sizeof(got);
	int fd;

	if (!m)
		return NULL;
	m->h = h;
	fd = listen_on(addr);
	if (fd < 0) {
		free(m);
		return NULL;
	}
	*port_out = 0;
	if (!getsockname(fd, (struct sockaddr *)&got, &glen))
		*port_out = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
							    : ((struct sockaddr_in *)&got)->sin_port);
	if (addr->sa_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	m->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handle, m,
				  MHD_OPTION_LISTEN_SOCKET, fd,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned int)16,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10,
				  MHD_OPTION_END);
	if (!m->mhd) {
		kvd_err("metrics-listen: libmicrohttpd could not start on its socket");
		close(fd);
		free(m);
		return NULL;
	}
	return m;
}

void kvd_metrics_stop(struct kvd_metrics *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->mhd);
	free(m);
}
