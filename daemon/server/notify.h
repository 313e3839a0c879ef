/* SPDX-License-Identifier: MIT */
/*
 * notify.h - systemd's readiness and watchdog protocol (sd_notify): a
 * datagram of "KEY=VALUE" lines to the socket named by $NOTIFY_SOCKET.
 * The protocol is documented as stable for reimplementation, so kvcached
 * speaks it directly instead of linking libsystemd for a dozen lines.
 */
#ifndef KVD_NOTIFY_H
#define KVD_NOTIFY_H

#include <stdint.h>

/* Send `state` (e.g. "READY=1"). 0 if sent or no $NOTIFY_SOCKET, else -errno. */
int kvd_notify(const char *state);

/* $WATCHDOG_USEC when $WATCHDOG_PID is unset or ours; 0 when no watchdog. */
uint64_t kvd_watchdog_usec(void);

#endif
