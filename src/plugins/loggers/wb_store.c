/* The wandb client's transaction log framing (see wb_store.h). */
#include "wb_store.h"

#include <errno.h>
#include <zlib.h>

enum { LOG_HEADER_LEN = CMI_WB_HEADER_LEN, LOG_BLOCK_LEN = CMI_WB_BLOCK_LEN };
enum { LOG_FULL = 1, LOG_FIRST = 2, LOG_MIDDLE = 3, LOG_LAST = 4 };

static void store_put(cmi_wb_store *s, const void *p, size_t n) {
    if (s->err || !n) return;
    if (fwrite(p, 1, n, s->f) != n) s->err = errno ? errno : EIO;
    s->index += (int64_t)n;
}

/* checksum: crc32 (zlib's) of the type byte, continued over the data */
static void store_record(cmi_wb_store *s, const uint8_t *data, size_t n, int type) {
    uint8_t t = (uint8_t)type;
    uLong crc = crc32(0L, &t, 1);
    crc = crc32(crc, data, (uInt)n);
    uint8_t h[7] = {(uint8_t)crc, (uint8_t)(crc >> 8), (uint8_t)(crc >> 16), (uint8_t)(crc >> 24),
                    (uint8_t)n, (uint8_t)(n >> 8), t};
    store_put(s, h, 7);
    store_put(s, data, n);
}

void cmi_wb_store_write(cmi_wb_store *s, const uint8_t *data, size_t n) {
    int64_t space = LOG_BLOCK_LEN - s->index % LOG_BLOCK_LEN;
    if (space < LOG_HEADER_LEN) { /* pad the block's tail with zeros */
        static const uint8_t zeros[LOG_HEADER_LEN] = {0};
        store_put(s, zeros, (size_t)space);
        space = LOG_BLOCK_LEN;
    }
    if ((int64_t)n + LOG_HEADER_LEN <= space) {
        store_record(s, data, n, LOG_FULL);
        return;
    }
    size_t room = (size_t)space - LOG_HEADER_LEN, used = room;
    store_record(s, data, room, LOG_FIRST);
    while (n - used > LOG_BLOCK_LEN - LOG_HEADER_LEN) {
        store_record(s, data + used, LOG_BLOCK_LEN - LOG_HEADER_LEN, LOG_MIDDLE);
        used += LOG_BLOCK_LEN - LOG_HEADER_LEN;
    }
    store_record(s, data + used, n - used, LOG_LAST);
}

void cmi_wb_store_header(cmi_wb_store *s) {
    const uint8_t head[7] = {':', 'W', '&', 'B', 0xE1, 0xBE, 0}; /* ident, magic 0xBEE1 LE, version 0 */
    store_put(s, head, 7);
}
