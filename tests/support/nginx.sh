# shellcheck shell=bash
# tests/support/nginx.sh — a real nginx as an HTTP destination (tests and
# benchmarks).  Source after lib.sh (uses $WORK, log, fatal, wait_until,
# port_in_use, track_pid).
#
# nginx_run LISTEN_OPTIONS SERVER_CONF [HTTP_CONF]: starts nginx in the
# foreground, one process, no master (nothing can respawn a worker while the
# exit trap kills it), on 127.0.0.1 and a free port, keep-alive for long runs.
# LISTEN_OPTIONS follow the address on the listen line ("" or "ssl http2"),
# SERVER_CONF goes into the server block, HTTP_CONF into the http block (log
# formats, access_log; "access_log off" by default).  Its files live in
# $WORK/nginx (NGINX_DIR).  Exports NGINX_PORT and NGINX_PID.
nginx_run() {
    local listen=$1 server=$2 http=${3:-access_log off;} port d=$WORK/nginx
    mkdir -p "$d/tmp"
    local attempt
    for attempt in 1 2 3 4 5 6 7 8; do
        port=$(random_port)
        port_in_use "$port" && continue
        cat >"$d/nginx.conf" <<EOF2
worker_processes 1;
daemon off;
master_process off;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    client_max_body_size 2m;
    client_body_buffer_size 2m;
    keepalive_requests 100000;
    keepalive_timeout 300s;
    $http
    server {
        listen 127.0.0.1:$port $listen;
        $server
    }
}
EOF2
        nginx -p "$d" -c "$d/nginx.conf" >>"$d/stdout.log" 2>&1 &
        NGINX_PID=$!
        track_pid "$NGINX_PID"
        wait_until 10 "port_in_use $port || ! kill -0 $NGINX_PID 2>/dev/null" >/dev/null
        port_in_use "$port" && break
        # lost the port to another listener: try another
        kill "$NGINX_PID" 2>/dev/null
        ((attempt < 8)) || { cat "$d/error.log" >&2; fatal "nginx did not start"; }
    done
    NGINX_DIR=$d
    NGINX_PORT=$port
    export NGINX_DIR NGINX_PORT NGINX_PID
}
