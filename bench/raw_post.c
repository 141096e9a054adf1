/*
 * raw_post — the raw limit for bench/dispatch: plain libcurl multi POSTs of a
 * JSON body to one URL, CONCURRENCY requests in flight at once over
 * keep-alive connections (at most CONCURRENCY of them), REQUESTS in all.
 * Easy handles are created once and re-added after each completion; the body
 * and the header list are shared, so nothing is allocated per request beyond
 * what libcurl itself needs.
 *
 * usage: raw_post URL REQUESTS CONCURRENCY [BODY_BYTES]   (body default 1024)
 * RAW_POST_HEADERS=FILE adds FILE's lines as request headers (one "Name:
 * value" per line; bench/spec_headers.txt holds the ~20 a delivery carries,
 * to weigh what SPEC §7.2's headers cost a plain client).
 * RAW_POST_SEQ_HEADER=NAME adds "NAME: <pid>-<n>" with n the request's
 * number, so that each request is a new event (bench/http-ingest: ce-id).
 * prints: "raw_post requests N seconds S rate R/s"
 * Exit status 1 when any request failed or answered other than 2xx.
 */
#include <curl/curl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "util.h"

/* The shared headers plus "name: <pid>-<seq>" (RAW_POST_SEQ_HEADER). */
static struct curl_slist *seq_headers(const struct curl_slist *base, const char *name, long seq) {
    struct curl_slist *l = NULL;
    char line[256];

    for (; base != NULL; base = base->next) {
        l = curl_slist_append(l, base->data);
    }
    snprintf(line, sizeof(line), "%s: %ld-%ld", name, (long)getpid(), seq);
    return curl_slist_append(l, line);
}

static size_t discard(char *ptr, size_t size, size_t nmemb, void *arg) {
    (void)ptr;
    (void)arg;
    return size * nmemb;
}

int main(int argc, char **argv) {
    const char *url;
    long requests, concurrency, body_bytes = 1024, started = 0, done = 0, failed = 0;
    char *body;
    CURL **easy;
    CURLM *multi;
    struct curl_slist *hdrs = NULL;
    struct curl_slist **own = NULL; /* per handle, with RAW_POST_SEQ_HEADER */
    const char *seq_name = getenv("RAW_POST_SEQ_HEADER");
    uint64_t t0;
    double secs, cpu_us;
    struct rusage ru;
    int running = 0;

    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: raw_post URL REQUESTS CONCURRENCY [BODY_BYTES]\n");
        return 2;
    }
    url = argv[1];
    requests = atol(argv[2]);
    concurrency = atol(argv[3]);
    if (argc == 5) {
        body_bytes = atol(argv[4]);
    }
    if (requests < 1 || concurrency < 1 || body_bytes < 16) {
        fprintf(stderr, "raw_post: bad arguments\n");
        return 2;
    }
    if (concurrency > requests) {
        concurrency = requests;
    }
    /* a JSON object padded to body_bytes, like hub-produce's payloads */
    body = malloc((size_t)body_bytes + 1);
    if (body == NULL) {
        return 1;
    }
    {
        const char *head = "{\"pad\":\"";
        size_t hl = strlen(head);
        memcpy(body, head, hl);
        memset(body + hl, 'x', (size_t)body_bytes - hl - 2);
        body[body_bytes - 2] = '"';
        body[body_bytes - 1] = '}';
        body[body_bytes] = '\0';
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (getenv("RAW_POST_HEADERS") != NULL) {
        FILE *f = fopen(getenv("RAW_POST_HEADERS"), "r");
        char line[1024];
        if (f == NULL) {
            perror("raw_post: RAW_POST_HEADERS");
            return 2;
        }
        while (hdrs != NULL && fgets(line, sizeof(line), f) != NULL) {
            line[strcspn(line, "\r\n")] = '\0';
            if (line[0] != '\0' && line[0] != '#') {
                hdrs = curl_slist_append(hdrs, line);
            }
        }
        fclose(f);
    }
    multi = curl_multi_init();
    curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, concurrency);
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, concurrency);
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, concurrency);
    easy = calloc((size_t)concurrency, sizeof *easy);
    own = calloc((size_t)concurrency, sizeof *own);
    if (easy == NULL || own == NULL || multi == NULL || hdrs == NULL) {
        return 1;
    }
    for (long i = 0; i < concurrency; i++) {
        CURL *e = curl_easy_init();
        easy[i] = e;
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, body_bytes);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 30000L);
        curl_easy_setopt(e, CURLOPT_USERAGENT, "bench-raw-post");
        curl_easy_setopt(e, CURLOPT_PRIVATE, (void *)(intptr_t)i);
    }

    t0 = hub_now_ns();
    for (long i = 0; i < concurrency; i++) {
        if (seq_name != NULL) {
            own[i] = seq_headers(hdrs, seq_name, started);
            curl_easy_setopt(easy[i], CURLOPT_HTTPHEADER, own[i]);
        }
        curl_multi_add_handle(multi, easy[i]);
        started++;
    }
    while (done < requests) {
        CURLMsg *msg;
        int left;
        CURLMcode mc = curl_multi_perform(multi, &running);
        if (mc != CURLM_OK) {
            fprintf(stderr, "raw_post: %s\n", curl_multi_strerror(mc));
            return 1;
        }
        while ((msg = curl_multi_info_read(multi, &left)) != NULL) {
            CURL *e;
            long status = 0;
            if (msg->msg != CURLMSG_DONE) {
                continue;
            }
            e = msg->easy_handle;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
            if (msg->data.result != CURLE_OK || status < 200 || status > 299) {
                if (failed < 5) {
                    fprintf(stderr, "raw_post: %s status %ld\n",
                            curl_easy_strerror(msg->data.result), status);
                }
                failed++;
            }
            done++;
            curl_multi_remove_handle(multi, e);
            if (started < requests) {
                if (seq_name != NULL) {
                    void *slot;
                    curl_easy_getinfo(e, CURLINFO_PRIVATE, &slot);
                    curl_slist_free_all(own[(intptr_t)slot]);
                    own[(intptr_t)slot] = seq_headers(hdrs, seq_name, started);
                    curl_easy_setopt(e, CURLOPT_HTTPHEADER, own[(intptr_t)slot]);
                }
                curl_multi_add_handle(multi, e); /* reuses its connection cache entry */
                started++;
            }
        }
        if (done < requests) {
            curl_multi_poll(multi, NULL, 0, 1000, NULL);
        }
    }
    secs = (double)(hub_now_ns() - t0) / 1e9;
    getrusage(RUSAGE_SELF, &ru);
    cpu_us = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
             (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    /* the rate stays the last field: bench/dispatch reads it there */
    printf("raw_post requests %ld seconds %.3f client_cpu_us_per_request %.1f rate %.0f/s\n", done,
           secs, done > 0 ? cpu_us / (double)done : 0.0, (double)done / secs);
    if (failed > 0) {
        fprintf(stderr, "raw_post: %ld requests failed\n", failed);
    }
    for (long i = 0; i < concurrency; i++) {
        curl_easy_cleanup(easy[i]);
        curl_slist_free_all(own[i]);
    }
    curl_multi_cleanup(multi);
    curl_slist_free_all(hdrs);
    free(easy);
    free(own);
    free(body);
    curl_global_cleanup();
    return failed > 0 ? 1 : 0;
}
