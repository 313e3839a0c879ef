/* SPDX-License-Identifier: MIT */
/*
 * connect.h - reaching kvcached and making sure it is the real one.
 *
 * A socket path is only a name: whoever could create it first may be
 * listening there. Before a client sends its tokens or trusts a page, it
 * checks whom it connected to: the peer's uid (SO_PEERCRED) must be its
 * own, root's, the installed service user's (`kvcached`), or one the user
 * named in $KVCACHED_DAEMON_USER. The per-user fallback folder
 * (/tmp/kvcached-UID, used when $XDG_RUNTIME_DIR is unset) must be the
 * user's own and writable by nobody else, or it is refused: another user
 * could have made it and serve there.
 */
#ifndef KVC_CONNECT_H
#define KVC_CONNECT_H

#include <stddef.h>

/*
 * Connect to path (NULL: the default path, kvproto_client_socket_path).
 * Returns a connected socket, or a negative errno with a message naming
 * the path (and the owner found, or the socket's permissions) in err:
 * -ENOENT / -ECONNREFUSED (no daemon), -EACCES (the socket file's
 * permissions keep this user out), -EKEYREJECTED (the folder or the
 * daemon is not to be trusted), -ENAMETOOLONG, or another connect errno.
 */
int kvc_connect_daemon(const char *path, char *err, size_t errlen);

#endif
