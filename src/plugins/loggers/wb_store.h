/* The wandb client's transaction log framing (wandb/sdk/internal/datastore.py, read by `wandb sync`
 * through core/pkg/leveldb with CRCAlgoIEEE): a 7-byte header ":W&B", magic 0xBEE1 (LE), version 0,
 * then 32 KiB blocks of records — u32 LE checksum (zlib's CRC-32 of the type byte, continued over
 * the data), u16 LE length, u8 type (1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST), the data — a payload that
 * does not fit the block split into FIRST / MIDDLE / LAST, a block's tail shorter than a record
 * header padded with zeros. Private to the WandBLogger; tests drive it to reach block edges. */
#ifndef CM_LOGGERS_WB_STORE_H
#define CM_LOGGERS_WB_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { CMI_WB_HEADER_LEN = 7, CMI_WB_BLOCK_LEN = 32768 };

typedef struct cmi_wb_store {
    FILE *f;       /* opened and closed by the caller */
    int64_t index; /* bytes written */
    int err;       /* the first errno (writes stop counting as done once set) */
} cmi_wb_store;

/* The file header; call once, first. */
void cmi_wb_store_header(cmi_wb_store *s);
/* One payload (a serialized Record), framed as datastore.py's _write_data does. */
void cmi_wb_store_write(cmi_wb_store *s, const uint8_t *data, size_t n);

#endif
