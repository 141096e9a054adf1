# shellcheck shell=bash
# bench/cpu.sh — CPU accounting for the benchmarks (from /proc, in clock
# ticks; CLK_TCK per second).

CLK_TCK=$(getconf CLK_TCK)

# cpu_ticks PID: user + system CPU of the process so far (0 once it is gone).
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# pg_cpu_ticks: CPU of the whole PostgreSQL server so far: the postmaster,
# the backends and workers that exited (their time is added to the
# postmaster's children time when it reaps them), and those still running.
pg_cpu_ticks() {
    local pm t p
    pm=$(head -n1 "$PG_DATA/postmaster.pid")
    t=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat")
    for p in $(pgrep -P "$pm"); do
        t=$((t + $(cpu_ticks "$p")))
    done
    echo "$t"
}

# pg_cpu_ticks_after_clients: pg_cpu_ticks once the backends of clients that
# just disconnected are gone: an exiting backend's CPU is in neither the
# running children nor the postmaster's children time until it is reaped.
pg_cpu_ticks_after_clients() {
    sleep 0.5
    pg_cpu_ticks
}

# pg_conn_ticks: one line "PID NAME TICKS" per PostgreSQL backend now
# running, NAME its application_name (the hub's pools name their
# connections: streaming-hub-ingest, -claim, -load, -outcomes, ...) or, for
# the server's own processes, its backend type.
pg_conn_ticks() {
    local pid name
    psql_q "SELECT pid, replace(coalesce(nullif(application_name, ''), backend_type), ' ', '_')
              FROM pg_stat_activity" | while IFS='|' read -r pid name; do
        echo "$pid $name $(cpu_ticks "$pid")"
    done
}

# pg_conn_split BEFORE AFTER COUNT NAME...: for each NAME, the microseconds
# of CPU per unit its backends spent between two pg_conn_ticks snapshots
# (backends in both), as "NAME=µs" words.
pg_conn_split() {
    local before=$1 after=$2 n=$3
    shift 3
    awk -v names="$*" -v n="$n" -v hz="$CLK_TCK" '
        FNR == NR { t0[$1] = $3; next }
        ($1 in t0) { d[$2] += $3 - t0[$1] }
        END {
            k = split(names, want, " ")
            for (i = 1; i <= k; i++)
                printf "%s%s=%.0f", (i > 1 ? " " : ""), want[i], (n > 0 ? d[want[i]] * 1e6 / hz / n : 0)
        }' <(echo "$before") <(echo "$after")
}

# machine_busy_ticks: CPU the whole machine spent busy so far, all cores
# (user, nice, system, irq, softirq, steal: everything but idle and iowait).
machine_busy_ticks() {
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

# per_unit TICKS COUNT: microseconds of CPU per unit.
per_unit() {
    awk -v t="$1" -v n="$2" -v hz="$CLK_TCK" 'BEGIN { printf "%.0f", (n > 0 ? t * 1e6 / hz / n : 0) }'
}
