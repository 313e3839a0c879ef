// SPDX-License-Identifier: MIT
/*
 * poolthread.c - an LD_PRELOAD shim for tests/integration/signals.c: when
 * kvcached creates its pool's memfd ("kvcached-pool", in kvd_pool_open),
 * start a thread named "kvt-early" that sleeps for the life of the
 * process, then create the memfd. That is the place, and the way, the
 * CUDA driver starts its threads when a cuda pool opens (cuInit, context
 * creation): a thread the daemon does not create itself, with the mask
 * it inherits from the main thread at that moment. Built without
 * sanitizers (it is preloaded before their runtime).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Named by itself once running: glibc starts a thread with every signal
 * blocked and sets the inherited mask in the thread's first steps, so
 * the name says the mask is the one it keeps. */
static void *sleeper(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "kvt-early");
	for (;;)
		pause();
	return NULL;
}

int memfd_create(const char *name, unsigned int flags)
{
	static int (*real)(const char *, unsigned int);
	static int started;
	pthread_t t;

	if (!real)
		real = (int (*)(const char *, unsigned int))dlsym(RTLD_NEXT, "memfd_create");
	if (!started && name && !strcmp(name, "kvcached-pool")) {
		started = 1;
		if (!pthread_create(&t, NULL, sleeper, NULL))
			pthread_detach(t);
	}
	return real(name, flags);
}
