#!/usr/bin/env bash
# The baseline of `benches/dict_memory.rs`: how much of a fill of values whose sizes are
# log-uniform from 16 B to 64 KiB an `ngx.shared.DICT` of 64m (`lua_shared_dict cache
# 64m`) holds, and what a churn of 100,000 more sets does to it (SharedDict issue #26, item
# 1). The same sizes as the bench: Park-Miller LCG (x = 48271 x mod 2^31-1, seed 42),
# u = (x-1)/(2^31-2), size = floor(16 * 4096^u); keys `k:N`.
#
#   bash scripts/nginx-zone.sh      # about 30 s; installs nginx-light and the lua module
#                                   # (Debian packages) if they are missing
#
# Phase A sets until the first forcible set (the zone is full); phase B sets 100,000 more
# and counts the "no memory" failures; a second nginx does `safe_set` until the first
# failure. Each phase prints key=value lines; the zone's resident size comes from the
# worker's /proc/PID/smaps. Not part of the test suite.
set -u
D=$(mktemp -d /tmp/shmlock-nginx-zone.XXXXXX)
mkdir -p "$D/conf" "$D/logs" "$D/tmp" "$D/lua"
chmod 755 "$D" "$D/lua" # (the worker runs as another user: it must read the Lua module)

# 1. install (only if missing)
if ! dpkg -s libnginx-mod-http-lua >/dev/null 2>&1 || ! command -v nginx >/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y nginx-light libnginx-mod-http-lua || {
    echo "install failed"; exit 1; }
fi
# Lua fill module (written every run, so the script is self-contained)
cat > "$D/lua/fill.lua" <<'LUA'
-- Fill / churn benchmark for ngx.shared.cache (lua_shared_dict cache 64m)
-- PRNG: Park-Miller "minimal standard" LCG, x_{n+1} = 48271 * x_n mod (2^31-1),
-- seed 42, exact in IEEE doubles. u = (x-1)/(2^31-2) in [0,1).
-- size = floor(16 * 4096^u)  (log-uniform 16 B .. 64 KiB-1)
local M = {}
local dict = ngx.shared.cache
local floor, srep, concat = math.floor, string.rep, table.concat
local MOD = 2147483647
local SEED = 42

local st = { x = SEED, i = 0, sets_ok = 0 }

local function nextsize()
  st.x = (st.x * 48271) % MOD
  local u = (st.x - 1) / (MOD - 1)
  return floor(16 * 4096 ^ u)
end

local out
local function p(k, v) out[#out + 1] = k .. "=" .. tostring(v) end

-- live keys & bytes, without changing LRU order:
-- get_keys walks the LRU queue from most- to least-recent; we get() in reverse
-- order so each get moves the key to the head and the final order is unchanged.
local function stats()
  local keys = dict:get_keys(0)
  local n, kb, vb = #keys, 0, 0
  local minidx, maxidx = math.huge, 0
  for j = n, 1, -1 do
    local k = keys[j]
    local v = dict:get(k)
    kb = kb + #k
    if v then vb = vb + #v end
    local idx = tonumber(k:sub(3))
    if idx < minidx then minidx = idx end
    if idx > maxidx then maxidx = idx end
  end
  p("live_keys", n)
  p("live_key_bytes", kb)
  p("live_value_bytes", vb)
  p("live_bytes", kb + vb)
  p("live_min_index", n > 0 and minidx or "-")
  p("live_max_index", maxidx)
  p("free_space", dict:free_space())
  p("capacity", dict:capacity())
  p("capacity_over_live_bytes", string.format("%.4f", dict:capacity() / (kb + vb)))
  p("next_index", st.i + 1)
end

-- Phase A: set() until the first forcible (or failed) set
local function phaseA()
  local cnt, bytes = 0, 0
  while true do
    st.i = st.i + 1
    local key = "k:" .. st.i
    local n = nextsize()
    local ok, err, forcible = dict:set(key, srep("x", n))
    if ok then st.sets_ok = st.sets_ok + 1 end
    if not ok or forcible then
      p("stored_before_stop", cnt)
      p("bytes_before_stop", bytes)
      p("ratio_64MiB_over_bytes", string.format("%.4f", 67108864 / bytes))
      p("stop_key", key); p("stop_size", n); p("stop_ok", ok)
      p("stop_err", err); p("stop_forcible", forcible)
      return
    end
    cnt = cnt + 1
    bytes = bytes + #key + n
  end
end

-- Phase B: N more set()s (forcible eviction allowed)
local function phaseB(N)
  local ok_plain, forc, fail, fail_bytes = 0, 0, 0, 0
  local errs, failsz = {}, {}
  for _ = 1, N do
    st.i = st.i + 1
    local key = "k:" .. st.i
    local n = nextsize()
    local ok, err, forcible = dict:set(key, srep("x", n))
    if ok then
      st.sets_ok = st.sets_ok + 1
      if forcible then forc = forc + 1 else ok_plain = ok_plain + 1 end
    else
      fail = fail + 1
      fail_bytes = fail_bytes + n
      errs[err] = (errs[err] or 0) + 1
      -- bucket failing sizes by power of two
      local b = 2 ^ floor(math.log(n) / math.log(2))
      failsz[b] = (failsz[b] or 0) + 1
    end
  end
  p("sets", N); p("ok_nonforcible", ok_plain); p("ok_forcible", forc)
  p("failed", fail); p("failed_value_bytes", fail_bytes)
  for e, c in pairs(errs) do p("err[" .. e .. "]", c) end
  local bs = {}
  for b in pairs(failsz) do bs[#bs + 1] = b end
  table.sort(bs)
  for _, b in ipairs(bs) do p("failed_size_bucket[" .. b .. ".." .. (2 * b - 1) .. "]", failsz[b]) end
  p("total_successful_sets_so_far", st.sets_ok)
end

-- Phase A': safe_set() until the first "no memory"
local function phaseS()
  local cnt, bytes = 0, 0
  while true do
    st.i = st.i + 1
    local key = "k:" .. st.i
    local n = nextsize()
    local ok, err = dict:safe_set(key, srep("x", n))
    if not ok then
      p("stored_before_fail", cnt)
      p("bytes_before_fail", bytes)
      p("ratio_64MiB_over_bytes", string.format("%.4f", 67108864 / bytes))
      p("fail_key", key); p("fail_size", n); p("fail_err", err)
      return
    end
    st.sets_ok = st.sets_ok + 1
    cnt = cnt + 1
    bytes = bytes + #key + n
  end
end

-- Phase A' continued: N more safe_set()s, to see which sizes still fit
local function phaseS2(N)
  local ok_c, ok_b, fail, minfail, maxok = 0, 0, 0, math.huge, 0
  local failsz, oksz = {}, {}
  for _ = 1, N do
    st.i = st.i + 1
    local key = "k:" .. st.i
    local n = nextsize()
    local ok, err = dict:safe_set(key, srep("x", n))
    local b = 2 ^ floor(math.log(n) / math.log(2))
    if ok then
      ok_c = ok_c + 1; ok_b = ok_b + #key + n
      if n > maxok then maxok = n end
      oksz[b] = (oksz[b] or 0) + 1
    else
      fail = fail + 1
      if n < minfail then minfail = n end
      failsz[b] = (failsz[b] or 0) + 1
    end
  end
  p("attempts", N); p("ok", ok_c); p("ok_bytes", ok_b); p("failed", fail)
  p("smallest_failed_size", minfail); p("largest_ok_size", maxok)
  local seen, bs = {}, {}
  for b in pairs(failsz) do if not seen[b] then seen[b] = 1; bs[#bs + 1] = b end end
  for b in pairs(oksz) do if not seen[b] then seen[b] = 1; bs[#bs + 1] = b end end
  table.sort(bs)
  for _, b in ipairs(bs) do
    p("bucket[" .. b .. ".." .. (2 * b - 1) .. "]", "ok " .. (oksz[b] or 0) .. " failed " .. (failsz[b] or 0))
  end
end

-- print the first N sizes (for cross-checking the PRNG) without consuming state
local function sizes(N)
  local save = st.x
  st.x = SEED
  local t = {}
  for j = 1, N do t[j] = nextsize() end
  st.x = save
  out[#out + 1] = concat(t, " ")
end

function M.handle()
  out = {}
  local a = ngx.req.get_uri_args()
  local ph = a.phase
  local t0 = ngx.now()
  ngx.update_time(); t0 = ngx.now()
  if ph == "A" then phaseA()
  elseif ph == "B" then phaseB(tonumber(a.n) or 100000)
  elseif ph == "S" then phaseS()
  elseif ph == "S2" then phaseS2(tonumber(a.n) or 20000)
  elseif ph == "stats" then stats()
  elseif ph == "sizes" then sizes(tonumber(a.n) or 10)
  else ngx.status = 400; ngx.say("unknown phase"); return end
  ngx.update_time()
  p("elapsed_s", string.format("%.3f", ngx.now() - t0))
  ngx.say(concat(out, "\n"))
end

return M
LUA

# 2. free port
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')

cat > "$D/conf/nginx.conf" <<CONF
daemon off;
master_process on;
worker_processes 1;
pid $D/logs/nginx.pid;
error_log $D/logs/error.log notice;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
events { worker_connections 64; }
http {
  access_log $D/logs/access.log;
  client_body_temp_path $D/tmp/body;
  proxy_temp_path $D/tmp/proxy;
  fastcgi_temp_path $D/tmp/fastcgi;
  uwsgi_temp_path $D/tmp/uwsgi;
  scgi_temp_path $D/tmp/scgi;
  lua_shared_dict cache 64m;
  lua_package_path "$D/lua/?.lua;;";
  server {
    listen 127.0.0.1:$PORT;
    location /run { content_by_lua_block { require("fill").handle() } }
  }
}
CONF

NGPID=""
start_nginx() {
  nginx -p "$D/" -e "$D/logs/error.log" -c "$D/conf/nginx.conf" -t -q || exit 1
  nginx -p "$D/" -e "$D/logs/error.log" -c "$D/conf/nginx.conf" &
  NGPID=$!
  for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/run?phase=sizes&n=1" && break
    sleep 0.1
  done
  WPID=$(pgrep -P "$NGPID" | head -1)
  echo "nginx master pid $NGPID, worker pid $WPID, port $PORT"
}
stop_nginx() {
  [ -n "$NGPID" ] && kill -QUIT "$NGPID" 2>/dev/null && wait "$NGPID" 2>/dev/null
  NGPID=""
}
trap 'stop_nginx; rm -rf "$D"' EXIT

# the 64 MiB shared anonymous mapping (ngx_shm_alloc: mmap MAP_ANON|MAP_SHARED -> "/dev/zero (deleted)")
zone_mem() {
  local pid=$1 who=$2
  awk -v who="$who" '
    /^[0-9a-f]+-[0-9a-f]+ / { inz = ($0 ~ /\/dev\/zero/ || $0 ~ /SYSV/) ; next }
    inz && /^Size:/ { sz = $2 }
    inz && /^Rss:/  { rss = $2 }
    inz && /^Pss:/  { pss = $2 }
    inz && /^Shared_Dirty:/ { sd = $2 }
    inz && /^Private_Dirty:/ { pd = $2;
       if (sz == 65536 || sz == 65540) printf "zone_smaps[%s] Size=%d kB Rss=%d kB Pss=%d kB Shared_Dirty=%d kB Private_Dirty=%d kB\n", who, sz, rss, pss, sd, pd }
  ' /proc/"$pid"/smaps
}
q() { # phase label, query
  echo "---- $1 ----"
  curl -s --max-time 3000 "http://127.0.0.1:$PORT/run?$2"
}
mem() { zone_mem "$WPID" worker; zone_mem "$NGPID" master; }

echo "nginx: $(nginx -v 2>&1)"
echo "packages: $(dpkg-query -W -f='${Package} ${Version}; ' nginx nginx-light libnginx-mod-http-lua libnginx-mod-http-ndk lua-resty-core libluajit2-5.1-2 2>/dev/null)"

# ---- run 1: Phase A then Phase B ----
start_nginx
q "first 10 sizes (seed 42)" "phase=sizes&n=10"
mem
q "Phase A: set() until first forcible" "phase=A"
q "Phase A: stats (get_keys(0)) after stop" "phase=stats"
mem
q "Phase B: 100000 more set()" "phase=B&n=100000"
q "Phase B: stats (get_keys(0))" "phase=stats"
mem
stop_nginx

# ---- run 2 (fresh nginx => fresh zone): Phase A' ----
start_nginx
q "Phase A': safe_set() until first no memory" "phase=S"
q "Phase A': stats at first failure" "phase=stats"
mem
q "Phase A' continued: 20000 more safe_set()" "phase=S2&n=20000"
q "Phase A' continued: stats" "phase=stats"
mem
stop_nginx
echo "done"
