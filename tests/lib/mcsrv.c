// SPDX-License-Identifier: MIT
/*
 * mcsrv.c - see mcsrv.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mcsrv.h"

const char *kvt_mc_bin(void)
{
	static const char *const where[] = { "/usr/bin/memcached", "/usr/local/bin/memcached" };
	size_t i;

	for (i = 0; i < sizeof(where) / sizeof(where[0]); i++)
		if (!access(where[i], X_OK))
			return where[i];
	return NULL;
}

/* A port nobody listens on now (the kernel's pick for an ephemeral bind). */
static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	uint16_t port = 0;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
	    !getsockname(fd, (struct sockaddr *)&a, &al))
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static bool accepts(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof(a));
	if (fd >= 0)
		close(fd);
	return ok;
}

static int launch(struct kvt_mc *m)
{
	const char *bin = kvt_mc_bin();
	char port[16], chunk[32], mem[16];
	int i, nul;
	uint64_t im;
	char unit;

	if (!bin || !m->port)
		return -1;
	snprintf(port, sizeof(port), "%u", m->port);
	/* Items under 512 KiB need slab chunks no larger than the items. */
	im = strtoull(m->item_max, NULL, 10);
	unit = m->item_max[strlen(m->item_max) - 1];
	im *= unit == 'm' ? 1u << 20 : unit == 'k' ? 1u << 10 : 1;
	snprintf(chunk, sizeof(chunk), "slab_chunk_max=%llu",
		 (unsigned long long)(im < (512u << 10) ? im : 512u << 10));
	snprintf(mem, sizeof(mem), "%u", m->mem_mb ? m->mem_mb : 64);
	m->pid = fork();
	if (m->pid < 0)
		return -1;
	if (!m->pid) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		nul = open("/dev/null", O_RDWR);
		if (nul >= 0) {
			dup2(nul, 1);
			dup2(nul, 2);
		}
		{
			const char *argv[] = { bin, "-l", "127.0.0.1", "-p", port, "-U", "0", "-I",
					       m->item_max, "-o", chunk, "-m", mem, "-t", "2",
					       /* As root memcached insists on -u. */
					       geteuid() ? NULL : "-u", "nobody", NULL };

			execv(bin, (char **)argv);
		}
		_exit(127);
	}
	for (i = 0; i < 500; i++) {	/* 5 s */
		struct timespec ts = { 0, 10 * 1000000L };
		int st;

		if (accepts(m->port))
			return 0;
		if (waitpid(m->pid, &st, WNOHANG) == m->pid) {
			m->pid = 0;
			return -1;
		}
		nanosleep(&ts, NULL);
	}
	kvt_mc_kill(m);
	return -1;
}

int kvt_mc_start(struct kvt_mc *m, const char *item_max)
{
	int tries;

	snprintf(m->item_max, sizeof(m->item_max), "%s", item_max);
	for (tries = 0; tries < 5; tries++) {
		if (!m->port)
			m->port = free_port();
		if (!launch(m))
			return 0;
		m->port = 0;	/* taken meanwhile: another one */
	}
	return -1;
}

int kvt_mc_restart(struct kvt_mc *m)
{
	return launch(m);
}

void kvt_mc_kill(struct kvt_mc *m)
{
	if (m->pid <= 0)
		return;
	kill(m->pid, SIGCONT);
	kill(m->pid, SIGKILL);
	waitpid(m->pid, NULL, 0);
	m->pid = 0;
}

void kvt_mc_stop(struct kvt_mc *m)
{
	if (m->pid > 0)
		kill(m->pid, SIGSTOP);
}

void kvt_mc_cont(struct kvt_mc *m)
{
	if (m->pid > 0)
		kill(m->pid, SIGCONT);
}

void kvt_mc_spec(char *out, size_t len, const struct kvt_mc *m, int n)
{
	size_t at = (size_t)snprintf(out, len, "memcached:");
	int i;

	for (i = 0; i < n && at < len; i++)
		at += (size_t)snprintf(out + at, len - at, "%s127.0.0.1:%u", i ? "," : "", m[i].port);
}

int kvt_secret_file(char *out, size_t len, const char *dir, const char *name, uint32_t seed)
{
	uint8_t b[32];
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
	int fd, i;

	for (i = 0; i < 32; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		b[i] = (uint8_t)(s >> 32);
	}
	snprintf(out, len, "%s/%s", dir, name);
	fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (write(fd, b, sizeof(b)) != (ssize_t)sizeof(b)) {
		close(fd);
		return -1;
	}
	return close(fd);
}
