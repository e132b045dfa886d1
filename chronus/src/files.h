/* File operations, run with the agent's own credentials (root in the sandbox). */
#ifndef CHRONUS_FILES_H
#define CHRONUS_FILES_H

#include "conn.h"

void file_stat(struct conn *c, const struct msg *m);
void file_read(struct conn *c, const struct msg *m);
void file_write(struct conn *c, const struct msg *m);
void file_listdir(struct conn *c, const struct msg *m);
void file_mkdir(struct conn *c, const struct msg *m);
void file_remove(struct conn *c, const struct msg *m);
void file_rename(struct conn *c, const struct msg *m);
void file_symlink(struct conn *c, const struct msg *m);
void file_statfs(struct conn *c, const struct msg *m);
void file_xattrs(struct conn *c, const struct msg *m);

#endif
