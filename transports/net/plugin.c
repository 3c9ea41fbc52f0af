/*
 * External NCCL net plugins: finding, opening and adapting them (net.h says the rules, the shared
 * reference net-plugin.md sections 1 and 2 NCCL's behaviour, which this follows, log texts
 * included: users grep them).
 *
 * Opened libraries stay loaded for the life of the process (NCCL with
 * NCCL_NET_PLUGIN_REF_COUNT=1): a plugin's threads or atexit handlers may outlive its last
 * communicator. Tables older than v11 are adapted through one static table per version, as NCCL
 * does (their calls carry no context to find a second table by), so one library per version.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/check.h"
#include "core/log.h"
#include "core/param.h"
#include "net.h"

WEFT_PARAM_STR(NetPlugin, "NCCL_NET_PLUGIN", NULL,
               "external net plugins to try, comma separated: a name (libnccl-net-<name>.so), a "
               "library or a path; 'none' for none (unset: libnccl-net.so)");
WEFT_PARAM_STR(NetName, "NCCL_NET", NULL,
               "use only the network of this name (Socket, or an external plugin's name)");

#define WEFT_NET_MAX_PLUGINS 14 /* as NCCL: 16 minus its two built-in networks */
#define WEFT_NET_NAME_MAX 255

/* One library named by NCCL_NET_PLUGIN that opened and exports a table we take. */
struct weft_net_lib {
    char path[PATH_MAX];
    void *dl;
    int version;        /* 11 .. 8 */
    const void *table;  /* the exported ncclNetPlugin_vN */
    int disabled;       /* init failed, no device, or another external was assigned */
    ncclNet_v11_t *v11; /* what communicators call: the plugin's table (v11) or an adapter */
};

static pthread_mutex_t weft_net_lock = PTHREAD_MUTEX_INITIALIZER;
static int weft_net_listed;
static struct weft_net_lib weft_net_libs[WEFT_NET_MAX_PLUGINS];
static int weft_net_nlibs;

/* ---- the logger and profiler a plugin gets ------------------------------------------------- */

static void weft_net_logger(ncclDebugLogLevel level, unsigned long flags, const char *file,
                            int line, const char *fmt, ...)
{
    if (level <= NCCL_LOG_NONE || level > NCCL_LOG_TRACE || fmt == NULL)
        return;
    if (weft_log_level < 0)
        weft_log_init();
    uint32_t subsys = (uint32_t)flags & WEFT_LOG_ALL;
    if (level != NCCL_LOG_WARN &&
        (weft_log_level < (int)level || (weft_log_mask & (subsys ? subsys : WEFT_LOG_NET)) == 0))
        return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    weft_log((int)level, level == NCCL_LOG_WARN ? WEFT_LOG_ALL : subsys, file ? file : "plugin",
             line, "%s", text);
}

static ncclResult_t weft_net_profiler(void **eHandle, int type, void *pHandle, int64_t pluginId,
                                      void *extData)
{
    (void)type, (void)pHandle, (void)pluginId, (void)extData;
    if (eHandle != NULL)
        *eHandle = NULL;
    return ncclSuccess;
}

/* ---- adapters: older tables seen as v11 ---------------------------------------------------- */

/* The plugin's table behind each adapter, and whether its once-per-process init succeeded. */
static const ncclNet_v10_t *weft_net_v10;
static const ncclNet_v9_t *weft_net_v9;
static const ncclNet_v8_t *weft_net_v8;
static int weft_net_old_init[3]; /* [v10, v9, v8]: 0 not yet, 1 done, -1 failed */
static ncclNet_v11_t weft_net_v10_as_v11, weft_net_v9_as_v11, weft_net_v8_as_v11;

/* The slots whose types did not change from v8 to v11: the adapter calls the plugin's own. */
#define WEFT_NET_ADAPT_SAME(a, o)                                                                  \
    do {                                                                                           \
        (a)->devices = (o)->devices;                                                               \
        (a)->accept = (o)->accept;                                                                 \
        (a)->regMr = (o)->regMr;                                                                   \
        (a)->regMrDmaBuf = (o)->regMrDmaBuf;                                                       \
        (a)->deregMr = (o)->deregMr;                                                               \
        (a)->iflush = (o)->iflush;                                                                 \
        (a)->test = (o)->test;                                                                     \
        (a)->closeSend = (o)->closeSend;                                                           \
        (a)->closeRecv = (o)->closeRecv;                                                           \
        (a)->closeListen = (o)->closeListen;                                                       \
        (a)->getDeviceMr = (o)->getDeviceMr;                                                       \
        (a)->irecvConsumed = (o)->irecvConsumed;                                                   \
    } while (0)

/* The per-communicator context of an adapted table: the config v10's connect takes. */
struct weft_net_old_ctx {
    ncclNetCommConfig_v10_t config;
};

static ncclResult_t weft_net_old_ctx_new(ncclNetCommConfig_v11_t *config, void **ctx)
{
    struct weft_net_old_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        WEFT_WARN("NET/Plugin: out of memory for a communicator's network context");
        return ncclSystemError;
    }
    c->config.trafficClass = config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
    *ctx = c;
    return ncclSuccess;
}

static ncclResult_t weft_net_old_finalize(void *ctx)
{
    free(ctx);
    return ncclSuccess;
}

/* v10 and v9 properties are v11's without maxMultiRequestSize. */
static void weft_net_props_from_v10(const ncclNetProperties_v10_t *p, ncclNetProperties_v11_t *q)
{
    memset(q, 0, sizeof(*q));
    memcpy(q, p, sizeof(*p));
    q->maxMultiRequestSize = 1;
}

static ncclResult_t weft_net_v10_props(int dev, ncclNetProperties_v11_t *props)
{
    ncclNetProperties_v10_t p;
    memset(&p, 0, sizeof(p));
    ncclResult_t res = weft_net_v10->getProperties(dev, &p);
    if (res == ncclSuccess)
        weft_net_props_from_v10(&p, props);
    return res;
}

static ncclResult_t weft_net_v10_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
    (void)ctx;
    return weft_net_v10->listen(dev, handle, listen_comm);
}

static ncclResult_t weft_net_v10_connect(void *ctx, int dev, void *handle, void **send_comm,
                                         ncclNetDeviceHandle_v11_t **dev_comm)
{
    return weft_net_v10->connect(dev, &((struct weft_net_old_ctx *)ctx)->config, handle, send_comm,
                                 dev_comm);
}

static ncclResult_t weft_net_v10_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                                      ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)comm_id;
    if (weft_net_old_init[0] == 0) {
        ncclResult_t res = weft_net_v10->init(logger, prof);
        weft_net_old_init[0] = res == ncclSuccess ? 1 : -1;
        if (res != ncclSuccess)
            return res;
        const ncclNet_v10_t *o = weft_net_v10;
        ncclNet_v11_t *a = &weft_net_v10_as_v11;
        WEFT_NET_ADAPT_SAME(a, o);
        a->getProperties = weft_net_v10_props;
        a->listen = weft_net_v10_listen;
        a->connect = weft_net_v10_connect;
        a->isend = o->isend;
        a->irecv = o->irecv;
        a->makeVDevice = o->makeVDevice;
    }
    if (weft_net_old_init[0] < 0)
        return ncclInternalError;
    return weft_net_old_ctx_new(config, ctx);
}

static ncclResult_t weft_net_v9_props(int dev, ncclNetProperties_v11_t *props)
{
    ncclNetProperties_v9_t p;
    memset(&p, 0, sizeof(p));
    ncclResult_t res = weft_net_v9->getProperties(dev, &p);
    if (res == ncclSuccess)
        weft_net_props_from_v10(&p, props);
    return res;
}

static ncclResult_t weft_net_v9_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
    (void)ctx;
    return weft_net_v9->listen(dev, handle, listen_comm);
}

static ncclResult_t weft_net_v9_connect(void *ctx, int dev, void *handle, void **send_comm,
                                        ncclNetDeviceHandle_v11_t **dev_comm)
{
    (void)ctx;
    return weft_net_v9->connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t weft_net_v9_isend(void *send_comm, void *data, size_t size, int tag,
                                      void *mhandle, void *phandle, void **request)
{
    (void)phandle;
    return weft_net_v9->isend(send_comm, data, size, tag, mhandle, request);
}

static ncclResult_t weft_net_v9_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                      void **mhandles, void **phandles, void **request)
{
    (void)phandles;
    return weft_net_v9->irecv(recv_comm, n, data, sizes, tags, mhandles, request);
}

static ncclResult_t weft_net_v9_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                                     ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)comm_id, (void)prof;
    if (weft_net_old_init[1] == 0) {
        ncclResult_t res = weft_net_v9->init(logger);
        weft_net_old_init[1] = res == ncclSuccess ? 1 : -1;
        if (res != ncclSuccess)
            return res;
        const ncclNet_v9_t *o = weft_net_v9;
        ncclNet_v11_t *a = &weft_net_v9_as_v11;
        WEFT_NET_ADAPT_SAME(a, o);
        a->getProperties = weft_net_v9_props;
        a->listen = weft_net_v9_listen;
        a->connect = weft_net_v9_connect;
        a->isend = o->isend ? weft_net_v9_isend : NULL;
        a->irecv = o->irecv ? weft_net_v9_irecv : NULL;
        a->makeVDevice = o->makeVDevice;
    }
    if (weft_net_old_init[1] < 0)
        return ncclInternalError;
    return weft_net_old_ctx_new(config, ctx);
}

/* v8 sizes are int: NCCL caps a v8 message at 1 GiB. */
#define WEFT_NET_V8_MAX_BYTES (1ull << 30)

static ncclResult_t weft_net_v8_props(int dev, ncclNetProperties_v11_t *props)
{
    ncclNetProperties_v8_t p;
    memset(&p, 0, sizeof(p));
    ncclResult_t res = weft_net_v8->getProperties(dev, &p);
    if (res != ncclSuccess)
        return res;
    memset(props, 0, sizeof(*props));
    props->name = p.name;
    props->pciPath = p.pciPath;
    props->guid = p.guid;
    props->ptrSupport = p.ptrSupport;
    props->regIsGlobal = p.regIsGlobal;
    props->forceFlush = 0;
    props->speed = p.speed;
    props->port = p.port;
    props->latency = p.latency;
    props->maxComms = p.maxComms;
    props->maxRecvs = p.maxRecvs;
    props->netDeviceType = p.netDeviceType;
    props->netDeviceVersion = p.netDeviceVersion;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = WEFT_NET_V8_MAX_BYTES;
    props->maxCollBytes = 512ull << 20;
    props->maxMultiRequestSize = 1;
    return ncclSuccess;
}

static ncclResult_t weft_net_v8_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
    (void)ctx;
    return weft_net_v8->listen(dev, handle, listen_comm);
}

static ncclResult_t weft_net_v8_connect(void *ctx, int dev, void *handle, void **send_comm,
                                        ncclNetDeviceHandle_v11_t **dev_comm)
{
    (void)ctx;
    return weft_net_v8->connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t weft_net_v8_isend(void *send_comm, void *data, size_t size, int tag,
                                      void *mhandle, void *phandle, void **request)
{
    (void)phandle;
    if (size > WEFT_NET_V8_MAX_BYTES) {
        WEFT_WARN("NET/Plugin: a v8 plugin cannot send %zu bytes at once (at most 1 GiB)", size);
        return ncclInternalError;
    }
    return weft_net_v8->isend(send_comm, data, (int)size, tag, mhandle, request);
}

static ncclResult_t weft_net_v8_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                      void **mhandles, void **phandles, void **request)
{
    (void)phandles;
    int isizes[NCCL_NET_MAX_REQUESTS];
    if (n < 1 || n > NCCL_NET_MAX_REQUESTS) {
        WEFT_WARN("NET/Plugin: a grouped receive of %d buffers (1 .. %d)", n,
                  NCCL_NET_MAX_REQUESTS);
        return ncclInternalError;
    }
    for (int i = 0; i < n; i++) {
        if (sizes[i] > WEFT_NET_V8_MAX_BYTES) {
            WEFT_WARN("NET/Plugin: a v8 plugin cannot receive %zu bytes at once (at most 1 GiB)",
                      sizes[i]);
            return ncclInternalError;
        }
        isizes[i] = (int)sizes[i];
    }
    ncclResult_t res = weft_net_v8->irecv(recv_comm, n, data, isizes, tags, mhandles, request);
    if (res == ncclSuccess && *request == (void *)NCCL_NET_OPTIONAL_RECV_COMPLETION)
        *request = NULL; /* v8 knows no optional completion: 0x1 means nothing was posted */
    return res;
}

static ncclResult_t weft_net_v8_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                                     ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)comm_id, (void)prof;
    if (weft_net_old_init[2] == 0) {
        ncclResult_t res = weft_net_v8->init(logger);
        weft_net_old_init[2] = res == ncclSuccess ? 1 : -1;
        if (res != ncclSuccess)
            return res;
        const ncclNet_v8_t *o = weft_net_v8;
        ncclNet_v11_t *a = &weft_net_v8_as_v11;
        WEFT_NET_ADAPT_SAME(a, o);
        a->getProperties = weft_net_v8_props;
        a->listen = weft_net_v8_listen;
        a->connect = weft_net_v8_connect;
        a->isend = o->isend ? weft_net_v8_isend : NULL;
        a->irecv = o->irecv ? weft_net_v8_irecv : NULL;
    }
    if (weft_net_old_init[2] < 0)
        return ncclInternalError;
    return weft_net_old_ctx_new(config, ctx);
}

/* Makes lib->v11 for a table of lib->version; 0 when this version's adapter is taken. */
static int weft_net_adapt(struct weft_net_lib *lib)
{
    ncclNet_v11_t *a;
    switch (lib->version) {
    case 11:
        lib->v11 = (ncclNet_v11_t *)lib->table; /* called through the plugin's own table */
        return 1;
    case 10:
        if (weft_net_v10 != NULL)
            return 0;
        weft_net_v10 = lib->table;
        a = &weft_net_v10_as_v11;
        a->name = weft_net_v10->name;
        a->init = weft_net_v10_init;
        break;
    case 9:
        if (weft_net_v9 != NULL)
            return 0;
        weft_net_v9 = lib->table;
        a = &weft_net_v9_as_v11;
        a->name = weft_net_v9->name;
        a->init = weft_net_v9_init;
        break;
    default:
        if (weft_net_v8 != NULL)
            return 0;
        weft_net_v8 = lib->table;
        a = &weft_net_v8_as_v11;
        a->name = weft_net_v8->name;
        a->init = weft_net_v8_init;
        break;
    }
    a->finalize = weft_net_old_finalize;
    lib->v11 = a;
    return 1;
}

/* ---- finding and opening ------------------------------------------------------------------- */

static const char *const weft_net_symbols[] = {"ncclNetPlugin_v11", "ncclNetPlugin_v10",
                                               "ncclNetPlugin_v9", "ncclNetPlugin_v8"};

/* dlopen with NCCL's name expansion. Appends to missing (names not found) or logs other
 * failures. */
static void *weft_net_dlopen(const char *name, char *missing, size_t missing_len)
{
    char alt[WEFT_NET_NAME_MAX + 32];
    const char *tries[2] = {name, NULL};
    size_t len = strlen(name);
    if (strncasecmp(name, "STATIC_PLUGIN", len) == 0)
        return dlopen(NULL, RTLD_NOW | RTLD_LOCAL);
    int libso = strncmp(name, "lib", 3) == 0 && len > 3 && strcmp(name + len - 3, ".so") == 0;
    if (strchr(name, '/') == NULL && !libso) {
        snprintf(alt, sizeof(alt), "libnccl-net-%s.so", name);
        tries[1] = alt;
    }
    for (int i = 0; i < 2 && tries[i] != NULL; i++) {
        void *dl = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
        if (dl != NULL)
            return dl;
        const char *err = dlerror();
        if (err != NULL && strstr(err, "No such file or directory") == NULL &&
            strstr(err, "cannot open shared object file") == NULL) {
            WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "NET/Plugin: %s: %s", tries[i], err);
        } else {
            size_t used = strlen(missing);
            snprintf(missing + used, missing_len - used, "%s%s", used ? " " : "", tries[i]);
        }
    }
    return NULL;
}

/* Opens one library and takes the newest table it exports. */
static void weft_net_load(const char *name, char *missing, size_t missing_len)
{
    void *dl = weft_net_dlopen(name, missing, missing_len);
    if (dl == NULL)
        return;
    char path[PATH_MAX];
    struct link_map *map = NULL;
    if (dlinfo(dl, RTLD_DI_LINKMAP, &map) == 0 && map != NULL && map->l_name != NULL &&
        map->l_name[0] != '\0')
        snprintf(path, sizeof(path), "%s", map->l_name);
    else
        snprintf(path, sizeof(path), "%s", name);
    for (int i = 0; i < weft_net_nlibs; i++) {
        if (weft_net_libs[i].dl == dl) {
            dlclose(dl); /* named twice: once is enough */
            return;
        }
    }
    for (int v = 0; v < 4; v++) {
        const void *table = dlsym(dl, weft_net_symbols[v]);
        if (table == NULL)
            continue;
        struct weft_net_lib *lib = &weft_net_libs[weft_net_nlibs];
        memset(lib, 0, sizeof(*lib));
        snprintf(lib->path, sizeof(lib->path), "%s", path);
        lib->dl = dl;
        lib->version = 11 - v;
        lib->table = table;
        const char *tname = *(const char *const *)table; /* name is every table's first slot */
        if (tname == NULL) {
            WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "NET/Plugin: %s: its table has no name", path);
            break;
        }
        if (((const ncclNet_v11_t *)table)->init == NULL) {
            WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "NET/Plugin: %s: its table has no init", path);
            break;
        }
        if (!weft_net_adapt(lib)) {
            WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET,
                      "NET/Plugin: %s: another plugin of table version v%d is loaded already; "
                      "skipped",
                      path, lib->version);
            return; /* keep the library open: the other plugin may be this one's dependency */
        }
        weft_net_nlibs++;
        WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "NET/Plugin: Loaded net plugin %s (v%d)", tname,
                  lib->version);
        WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Successfully loaded external network plugin %s",
                  path);
        return;
    }
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "External network plugin %s is unsupported", path);
    dlclose(dl);
}

/* Builds the list of external plugins once per process. */
static void weft_net_list(void)
{
    if (weft_net_listed)
        return;
    weft_net_listed = 1;
    const char *spec = weft_param_NetPlugin();
    if (spec == NULL || spec[0] == '\0')
        spec = "libnccl-net.so";
    else if (strcasecmp(spec, "none") == 0)
        return;
    char missing[2048] = "";
    const char *p = spec;
    int tokens = 0;
    while (*p != '\0' && weft_net_nlibs < WEFT_NET_MAX_PLUGINS) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && len < WEFT_NET_NAME_MAX && tokens < WEFT_NET_MAX_PLUGINS) {
            char name[WEFT_NET_NAME_MAX + 1];
            memcpy(name, p, len);
            name[len] = '\0';
            weft_net_load(name, missing, sizeof(missing));
        }
        tokens++;
        p += len + (end != NULL);
    }
    if (missing[0] != '\0')
        WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "NET/Plugin: Could not find: %s", missing);
}

/* ---- per communicator ---------------------------------------------------------------------- */

/* Slots every provider must fill (after init: some plugins fill their table in init). */
static const char *weft_net_missing_slot(const ncclNet_v11_t *t, int version)
{
    if (t->devices == NULL)
        return "devices";
    if (t->getProperties == NULL)
        return "getProperties";
    if (t->listen == NULL)
        return "listen";
    if (t->connect == NULL)
        return "connect";
    if (t->accept == NULL)
        return "accept";
    if (t->regMr == NULL)
        return "regMr";
    if (t->deregMr == NULL)
        return "deregMr";
    if (t->isend == NULL)
        return "isend";
    if (t->irecv == NULL)
        return "irecv";
    if (t->iflush == NULL)
        return "iflush";
    if (t->test == NULL)
        return "test";
    if (t->closeSend == NULL)
        return "closeSend";
    if (t->closeRecv == NULL)
        return "closeRecv";
    if (t->closeListen == NULL)
        return "closeListen";
    if (version == 11 && t->finalize == NULL)
        return "finalize";
    return NULL;
}

/* Inits lib for one communicator; ncclSuccess with *net_p set, or the reason it is unusable. */
static ncclResult_t weft_net_try(struct weft_net_lib *lib, uint64_t comm_hash, int traffic_class,
                                 struct weft_net **net_p)
{
    ncclResult_t res;
    struct weft_net *net;
    WEFT_CALLOC(net, 1);
    const ncclNet_v11_t *t = lib->v11;
    ncclNetCommConfig_v11_t config = {.trafficClass = traffic_class};
    void *ctx = NULL;
    const char *why = NULL;
    res = t->init(&ctx, comm_hash, &config, weft_net_logger, weft_net_profiler);
    if (res != ncclSuccess) {
        why = "init failed";
        goto fail_finalize; /* as NCCL: a plugin may have made its context before failing */
    }
    const char *slot = weft_net_missing_slot(t, lib->version);
    if (slot != NULL) {
        WEFT_WARN("NET/Plugin: %s (v%d, %s) left slot %s empty after init", t->name, lib->version,
                  lib->path, slot);
        why = "a required slot is empty";
        res = ncclInternalError;
        goto fail_finalize;
    }
    int ndev = 0;
    res = t->devices(&ndev);
    if (res != ncclSuccess || ndev <= 0) {
        why = res != ncclSuccess ? "devices failed" : "it reports no device";
        res = res != ncclSuccess ? res : ncclInternalError;
        goto fail_finalize;
    }
    memset(&net->props, 0, sizeof(net->props));
    res = t->getProperties(0, &net->props);
    if (res != ncclSuccess) {
        why = "getProperties failed";
        goto fail_finalize;
    }
    if (net->props.netDeviceType != NCCL_NET_DEVICE_HOST) {
        WEFT_WARN("NET/Plugin: %s: Unknown device code index %d (Weft drives host-progressed "
                  "networks only)",
                  t->name, (int)net->props.netDeviceType);
        why = "its devices need device offload";
        res = ncclInternalError;
        goto fail_finalize;
    }
    if ((net->props.ptrSupport & NCCL_PTR_HOST) == 0) {
        why = "it cannot register host memory";
        res = ncclInternalError;
        goto fail_finalize;
    }
    net->table = t;
    net->ctx = ctx;
    net->name = t->name;
    net->version = lib->version;
    net->path = lib->path;
    net->ndev = ndev;
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Initialized NET plugin %s", t->name);
    *net_p = net;
    return ncclSuccess;
fail_finalize:
    if (t->finalize != NULL)
        (void)t->finalize(ctx);
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Failed to initialize NET plugin %s (%s: %s)",
              t->name ? t->name : lib->path, lib->path, why);
    lib->disabled = 1;
    free(net);
    return res;
}

ncclResult_t weft_net_open(uint64_t comm_hash, int traffic_class, const char *net_name,
                           struct weft_net **net_p)
{
    const char *env = weft_param_NetName();
    if (env != NULL && env[0] != '\0') {
        if (net_name != NULL && strcasecmp(net_name, env) != 0)
            WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Comm config netName reset to NCCL_NET=%s",
                      env);
        net_name = env;
    } else if (net_name != NULL && net_name[0] == '\0') {
        net_name = NULL;
    }
    ncclResult_t res = ncclSuccess;
    struct weft_net *net = NULL;
    char seen[512] = "";
    pthread_mutex_lock(&weft_net_lock);
    weft_net_list();
    for (int i = 0; i < weft_net_nlibs && net == NULL; i++) {
        struct weft_net_lib *lib = &weft_net_libs[i];
        const char *name = lib->v11->name; /* read again: a plugin may rename itself in init */
        if (lib->disabled || (net_name != NULL && (name == NULL || strcasecmp(name, net_name))))
            continue;
        if (weft_net_try(lib, comm_hash, traffic_class, &net) != ncclSuccess)
            continue;
        WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Assigned NET plugin %s to comm", net->name);
        for (int j = 0; j < weft_net_nlibs; j++) {
            if (j != i && !weft_net_libs[j].disabled) {
                WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Disabling external plugin %s",
                          weft_net_libs[j].path);
                weft_net_libs[j].disabled = 1;
            }
        }
    }
    for (int i = 0; i < weft_net_nlibs; i++) {
        const char *name = weft_net_libs[i].v11->name;
        size_t used = strlen(seen);
        snprintf(seen + used, sizeof(seen) - used, "%.64s%s, ", name ? name : weft_net_libs[i].path,
                 weft_net_libs[i].disabled ? " (unusable: see the INFO lines of NET)" : "");
    }
    pthread_mutex_unlock(&weft_net_lock);
    if (net == NULL && net_name != NULL && strcasecmp(net_name, "Socket") != 0) {
        WEFT_WARN("NCCL_NET %s: no usable network of that name (networks: %sSocket)", net_name,
                  seen);
        return ncclInvalidUsage;
    }
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_NET, "Using network %s", net ? net->name : "Socket");
    *net_p = net;
    return res;
}

void weft_net_close(struct weft_net *net)
{
    if (net == NULL)
        return;
    if (net->table->finalize != NULL)
        (void)net->table->finalize(net->ctx);
    free(net);
}

int64_t weft_net_id(const struct weft_net *net)
{
    if (net == NULL)
        return 0;
    /* FNV-1a over the name (case folded, as NCCL_NET compares) and the table version */
    uint64_t h = 1469598103934665603ull;
    for (const char *s = net->name; s != NULL && *s != '\0'; s++) {
        h ^= (uint64_t)(unsigned char)tolower((unsigned char)*s);
        h *= 1099511628211ull;
    }
    h ^= (uint64_t)net->version;
    h *= 1099511628211ull;
    return (int64_t)(h >> 1) | 1; /* never 0: that is the built-in socket */
}
