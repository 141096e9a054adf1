# shellcheck shell=bash
# bench/lib.sh — pieces the delivery benchmarks share.  Source after
# tests/support/lib.sh (uses $WORK, $BUILD, psql_q, hub_start/hub_stop,
# produce, log, fatal, wait_until, port_in_use, track_pid) and sources
# tests/support/nginx.sh.

source "$(dirname "${BASH_SOURCE[0]}")/../tests/support/nginx.sh"
source "$(dirname "${BASH_SOURCE[0]}")/cpu.sh"

# ---------------------------------------------------------------------------
# nginx_start: the sink (tests/support/nginx.sh) answering 200 everywhere;
# /lat logs receipt time and ce-time to $WORK/nginx/lat.log, /ack receipt
# time and the event id to $WORK/nginx/ack.log.  Exports SINK_URL.
# ---------------------------------------------------------------------------
nginx_start() {
    nginx_run "" \
        "location / { return 200 \"ok\"; }
        location /lat { access_log $WORK/nginx/lat.log lat; return 200 \"ok\"; }
        location /ack { access_log $WORK/nginx/ack.log ack; return 200 \"ok\"; }" \
        "access_log off; log_format lat '\$msec \$http_ce_time';
        log_format ack '\$msec \$http_x_lerian_event_id';"
    SINK_URL=http://127.0.0.1:$NGINX_PORT
    log "nginx sink at $SINK_URL (pid $NGINX_PID)"
}

# hub_deliveries OUTCOMES: deliveries of the running hub whose outcome label
# matches the regular expression OUTCOMES (its streaming_hub_deliveries_total
# counters): cheaper than counting jobs in the database, whose CPU the drain
# being measured needs
hub_deliveries() {
    curl -s --max-time 10 "$HUB_URL/metrics" | awk -v want="^($1)\$" '
        $1 ~ /^streaming_hub_deliveries_total\{outcome="/ {
            o = $1; sub(/^[^"]*"/, "", o); sub(/".*$/, "", o)
            if (o ~ want) n += $2
        }
        END { print n + 0 }'
}

# ---------------------------------------------------------------------------
# drain: one pre-filled-backlog run.  Needs TOPIC, PAYLOAD, HUB_ENV (array)
# and RAW (assoc. array: concurrency → raw req/s), or RAW_AROUND set to a
# function that measures the raw limit at a concurrency into RAW_LAST (req/s):
# it then runs right before the drain and right after it, and the drain's
# ratio is taken against the mean of the two (the machine's speed moves by up
# to 1.7x within minutes: a limit measured once, at the start of the bench,
# set a fast minute against a slow one).  The hub is started with
# ROLE=ingest to store N events and their jobs, stopped, then started with
# ROLE=delivery (plus DRAIN_ENV, an optional array) and the drain is timed.
# Appends a result line to RESULTS and sets DRAIN_RATE (deliveries/s over the
# middle 80% of attempts) and DRAIN_FIRST_JOB (jobs of this run have a
# greater id).  DRAIN_HOOK, when set, is run (as a command) once the drain
# has started, in the background of the poll loop.  PG_STATS=1 prints the
# drain's ten most expensive statements (pg_stat_statements; the bench
# preloads the module through PG_EXTRA_CONF) and its WAL per delivery (pg_stat_wal).
# ---------------------------------------------------------------------------
# pg_start_for_drains: pg_start, with pg_stat_statements preloaded and
# created when PG_STATS is set (drain prints from it).
pg_start_for_drains() {
    if [[ -n ${PG_STATS:-} ]]; then
        PG_EXTRA_CONF="shared_preload_libraries = 'pg_stat_statements,auto_explain'
${PG_EXTRA_CONF:-}"
    fi
    pg_start
    [[ -z ${PG_STATS:-} ]] || psql_q "CREATE EXTENSION pg_stat_statements" >/dev/null
}

# pg_stats_reset / pg_stats_print N: with PG_STATS set, clear
# pg_stat_statements and pg_stat_wal, and print (to stderr) the ten most
# expensive statements since and the WAL per delivery of N deliveries
pg_stats_reset() {
    [[ -z ${PG_STATS:-} ]] || psql_q "SELECT pg_stat_statements_reset(), pg_stat_reset_shared('wal')" >/dev/null
}
pg_stats_print() {
    [[ -n ${PG_STATS:-} ]] || return 0
    psql_q "SELECT round(total_exec_time::numeric, 0) AS ms, calls, rows,
            round((total_exec_time / greatest(rows, 1) * 1000)::numeric, 1) AS us_per_row,
            left(regexp_replace(query, '\s+', ' ', 'g'), 90)
        FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 10" >&2
    psql_q "SELECT 'WAL per delivery: ' || round(wal_bytes / $1) || ' bytes, '
            || round(wal_records::numeric / $1, 1) || ' records, ' || round(wal_fpi::numeric / $1, 2)
            || ' full-page images' FROM pg_stat_wal" >&2
}

RUN=0
RESULTS=()
DRAIN_ENV=()
# drain LABEL WORKERS BATCH EVENTS EXPECTED_JOBS PRODUCE_ARGS...
drain() {
    local label=$1 w=$2 b=$3 n=$4 want=$5 job0 rss c s total span att errs
    shift 5
    RUN=$((RUN + 1))
    job0=$(psql_q "SELECT coalesce(max(id), 0) FROM delivery_jobs")
    hub_start "${HUB_ENV[@]}" STREAMING_HUB_ROLE=ingest
    log "run $RUN ($label, $w workers, batch $b): producing $n events → $want jobs"
    HUB_PRODUCE_LINGER_MS=50 produce --topic $TOPIC --count "$n" --partitions 16 \
        --payload-bytes "$PAYLOAD" --id-prefix "r$RUN-" "$@" >/dev/null
    wait_until 300 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE id > $job0\") -ge $want ]]" ||
        log "run $RUN: only $(psql_q "SELECT count(*) FROM delivery_jobs WHERE id > $job0") jobs were created"
    hub_stop
    psql_q "CHECKPOINT" >/dev/null
    total=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE id > $job0")
    local raw_before=
    if [[ -n ${RAW_AROUND:-} ]]; then
        $RAW_AROUND "$w"
        raw_before=$RAW_LAST
    fi
    hub_start "${HUB_ENV[@]}" "${DRAIN_ENV[@]}" STREAMING_HUB_ROLE=delivery \
        STREAMING_HUB_DISPATCH_WORKERS="$w" STREAMING_HUB_DISPATCH_CLAIM_BATCH="$b"
    DRAIN_FIRST_JOB=$job0
    pg_stats_reset
    local hub0 pg0 all0 conns0 split
    conns0=$(pg_conn_ticks)
    hub0=$(cpu_ticks "$HUB_PID")
    pg0=$(pg_cpu_ticks)
    all0=$(machine_busy_ticks)
    local hook_pid=
    if [[ -n ${DRAIN_HOOK:-} ]]; then
        $DRAIN_HOOK &
        hook_pid=$!
    fi
    # Poll the hub's outcome counters, and the database only once they add
    # up: a count over the run's jobs took 18-60 ms of PostgreSQL's CPU per
    # poll (up to 7% of the drain's), competing with the drain it measures.
    # Once a second: the rates come from the attempts' timestamps, not from
    # when the poll saw the end, and each poll forks curl and awk (polling
    # every 200 ms, those took 4% of the machine's CPU during a drain).
    local deadline=$((SECONDS + 600)) ended
    while ((SECONDS < deadline)); do
        ended=$(hub_deliveries 'succeeded|dead|poison')
        if ((ended >= total)) &&
            [[ $(psql_q "SELECT count(*) FROM delivery_jobs WHERE id > $job0 AND state IN ('pending', 'in_flight')") == 0 ]]; then
            break
        fi
        sleep 1
    done
    ((SECONDS < deadline)) || log "run $RUN: the backlog did not drain within 600 s"
    [[ -n $hook_pid ]] && wait "$hook_pid"
    rss=$(awk '/VmHWM/ {print $2}' "/proc/$HUB_PID/status")
    # CPU of the drain: the hub's, and the whole PostgreSQL server's (the
    # final polls' backend included)
    local hubcpu=$(($(cpu_ticks "$HUB_PID") - hub0)) pgcpu=$(($(pg_cpu_ticks) - pg0))
    local allcpu=$(($(machine_busy_ticks) - all0))
    split=$(pg_conn_split "$conns0" "$(pg_conn_ticks)" "$(hub_deliveries 'succeeded|dead|poison')" \
        streaming-hub-claim streaming-hub-load streaming-hub-outcomes)
    log "run $RUN: PostgreSQL CPU per delivery by hub connection (µs): ${split//streaming-hub-/}"
    pg_stats_print "$want"
    errs=$(grep -cE '"level":"(error|warn)' "$HUB_LOG")
    hub_stop
    if [[ -n ${RAW_AROUND:-} ]]; then
        $RAW_AROUND "$w"
        RAW[$w]=$(awk -v a="$raw_before" -v b="$RAW_LAST" 'BEGIN { printf "%.0f", (a + b) / 2 }')
    fi
    read -r c s <<<"$(psql_q "SELECT count(*) * 0.8, extract(epoch FROM
                                percentile_disc(0.9) WITHIN GROUP (ORDER BY a.started_at) -
                                percentile_disc(0.1) WITHIN GROUP (ORDER BY a.started_at))
                             FROM delivery_attempts a WHERE a.job_id > $job0" | tr '|' ' ')"
    c=${c%.*}
    span=$(psql_q "SELECT extract(epoch FROM (SELECT max(updated_at) FROM delivery_jobs WHERE id > $job0 AND state = 'succeeded') -
                                         (SELECT min(started_at) FROM delivery_attempts WHERE job_id > $job0))")
    att=$(psql_q "SELECT string_agg(n || '×' || k || (CASE WHEN st <> 'succeeded' THEN ' ' || st ELSE '' END), ', ')
                    FROM (SELECT attempt_count k, state st, count(*) n FROM delivery_jobs WHERE id > $job0
                           GROUP BY 1, 2 ORDER BY 1, 2) x")
    local ok=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE id > $job0 AND state = 'succeeded'")
    [[ -n ${BENCH_DEBUG:-} ]] && psql_q "SELECT to_char(date_trunc('second', started_at), 'HH24:MI:SS'), count(*) FROM delivery_attempts WHERE job_id > $job0 GROUP BY 1 ORDER BY 1" >&2
    local rate full ratio
    rate=$(awk -v n="$c" -v s="$s" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
    full=$(awk -v n="$ok" -v s="$span" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
    DRAIN_RATE=$rate
    ratio=$(awk -v h="$rate" -v r="${RAW[$w]:-0}" 'BEGIN { printf "%.2f", (r > 0 ? h / r : 0) }')
    local us_hub us_pg us_all ceiling
    us_hub=$(per_unit "$hubcpu" "$ok")
    us_pg=$(per_unit "$pgcpu" "$ok")
    # The machine's busy CPU per delivery over the drain (every process:
    # hub, PostgreSQL, nginx, the bench's polls), and the ratio the drain
    # would reach if it kept every core busy at that cost: what CPU allows
    # this build on this machine, whatever the scheduling.
    us_all=$(per_unit "$allcpu" "$ok")
    ceiling=$(awk -v u="$us_all" -v c="$(nproc)" -v r="${RAW[$w]:-0}" \
        'BEGIN { printf "%.2f", (u > 0 && r > 0 ? c * 1e6 / u / r : 0) }')
    RESULTS+=("$(printf '  %-7s %3s/%-3s %7s %7s %7.2f s %8s %8s %8s %5s  %4s MiB  %4s µs %4s µs %4s µs %5s  %s  [%s warn/error log lines]' \
        "$label" "$w" "$b" "$total" "$ok" "$span" "$full" "$rate" "${RAW[$w]:--}" "$ratio" "$((rss / 1024))" \
        "$us_hub" "$us_pg" "$us_all" "$ceiling" "$att" "$errs")")
    log "${RESULTS[-1]}"
}

