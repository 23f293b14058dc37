//! The server-side scripts. Each touches only keys of one cluster hash tag (the lock key,
//! its fence counter, its release channel, and the short-lived keys named after one hold's
//! token all start with `PREFIX{KEY}`), so a Cluster runs each on the master of that slot.
//! A hold is recognised by the first 32 characters of the lock key's value, its token (see
//! `identity`).
//!
//! Times are the server's (`TIME`, in microseconds since the epoch): a Lua number holds
//! them exactly (below 2^53 until the year 2255). Scripts that read `TIME` and then write
//! are replicated by their effects (the only way since Redis 7, the default since 5; older
//! servers are asked for it).

/// The Lua shared by the scripts that touch shared holds (readers and permits). A key's
/// shared holds are two keys beside its lock key: `PREFIX{KEY}:shared`, a hash of each
/// hold's token to its value (as an exclusive holder's) with the field `limit` (the count
/// of a semaphore, `0` for readers), and `PREFIX{KEY}:leases`, a sorted set of the same
/// tokens scored by the end of each one's lease (server µs; `inf`: none). The sorted set is
/// the truth: a hold is ours while its score is ahead of the server's clock. Both keys
/// expire with the last lease, and every script that counts holds first drops the lapsed
/// ones (`prune`). Numbers go to Redis through `string.format('%.0f')`: Lua's own
/// conversion keeps 14 digits, fewer than a time in µs has.
macro_rules! shared_lua {
    () => {
        r"
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), t
end
local function keep(shared, leases)
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  if #last == 0 then redis.call('DEL', shared) return end
  if last[2] == 'inf' then
    redis.call('PERSIST', leases)
    redis.call('PERSIST', shared)
  else
    local at = string.format('%.0f', math.floor(tonumber(last[2]) / 1000) + 1)
    redis.call('PEXPIREAT', leases, at)
    redis.call('PEXPIREAT', shared, at)
  end
end
local function prune(shared, leases, now)
  local at = string.format('%.0f', now)
  local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', at, 'LIMIT', 0, 500)
  local dropped = #gone > 0
  while #gone > 0 do
    redis.call('HDEL', shared, unpack(gone))
    redis.call('ZREM', leases, unpack(gone))
    gone = redis.call('ZRANGEBYSCORE', leases, '-inf', at, 'LIMIT', 0, 500)
  end
  if dropped then keep(shared, leases) end
  local n = redis.call('ZCARD', leases)
  if n == 0 then redis.call('DEL', shared) end
  return n
end
-- whether a waiting mark stands: GET, not EXISTS, so that a value of another type there
-- is a WRONGTYPE error (named by the client) rather than a mark that never lapses
local function mark(k)
  return redis.call('GET', k) ~= false
end
local function live(leases, token, now)
  local at = redis.call('ZSCORE', leases, token)
  return at ~= false and at ~= nil and (at == 'inf' or tonumber(at) > now)
end
local function drop_shared(shared, leases, token)
  redis.call('HDEL', shared, token)
  redis.call('ZREM', leases, token)
  keep(shared, leases)
end
local function first_shared(shared, leases)
  local f = redis.call('ZRANGE', leases, 0, 0)
  local w = f[1] and redis.call('HGET', shared, f[1])
  if w then return string.sub(w, 34) end
  return ''
end
"
    };
}

/// Takes the key for a new hold in the mode `ARGV[4]` asks (`-1` exclusive, `0` a reader,
/// `N` one of a semaphore's N permits), unless the attempt came too late: `{1, s, us, ''}`
/// taken; `{0, s, us, who}` held by an exclusive holder, `{-1, s, us, who}` kept out by
/// shared holds (or, for a reader, by a writer's mark) (`who`: a holder's value past its
/// token, for the error of a wait that gives up; the token itself stays on the server);
/// `{-4, s, us, count}` the key's shared holds are of another count; `{-2, s, us, ''}`
/// refused because the server runs it after the attempt's deadline (`ARGV[3]`, server µs;
/// `0`: none); `{-3, s, us, ''}` refused because the attempt was cancelled before it
/// arrived (its marker, `KEYS[2]`, exists); `{-5, s, us, ''}` the lock key holds a string
/// that is not a hold's value (not its 32 hex digits of token and a space: something
/// else wrote it). `s`, `us`: the server's clock when it ran. An
/// attempt that finds its own token already holding the key (the same request delivered
/// twice: redis-rs's cluster connection sends a request again after a timeout) is told it
/// took the key, so the hold is never left without its asker.
///
/// KEYS: the lock key, the cancel marker, the shared holds' hash and leases, the writer's
/// mark (`PREFIX{KEY}:writer`: a writer sleeping on shared holds keeps new ones, readers
/// and permits, out while it lives, see `BLOCKED`) and the readers' mark
/// (`PREFIX{KEY}:readers`: a reader or permit waiter sleeping on a writer keeps the next
/// writer out, so that they take turns). A writer that takes the key removes the writer's
/// mark, a shared hold the readers'.
pub(crate) const ACQUIRE: &str = concat!(
    shared_lua!(),
    r"
if redis.replicate_commands then redis.replicate_commands() end
local now, t = clock()
local tok = string.sub(ARGV[1], 1, 32)
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == tok then return {1, t[1], t[2], ''} end
-- (a key with no shared hold and no mark costs one EXISTS here)
local marked = redis.call('EXISTS', KEYS[4], KEYS[5], KEYS[6]) > 0
local shared = marked and redis.call('EXISTS', KEYS[4]) == 1
if shared and live(KEYS[4], tok, now) then return {1, t[1], t[2], ''} end
if ARGV[3] ~= '0' and now > tonumber(ARGV[3]) then return {-2, t[1], t[2], ''} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {-3, t[1], t[2], ''} end
if v then
  -- (a value that is not a hold's, written by something else: waiting for it could be
  -- for ever)
  if not string.find(v, '^' .. string.rep('%x', 32) .. ' ') then return {-5, t[1], t[2], ''} end
  return {0, t[1], t[2], string.sub(v, 34)}
end
local want = tonumber(ARGV[4])
local n = 0
if shared then n = prune(KEYS[3], KEYS[4], now) end
if want < 0 then
  if n > 0 then return {-1, t[1], t[2], first_shared(KEYS[3], KEYS[4])} end
  -- readers' turn, unless a writer waits too (both marks, no hold: writers first, and
  -- the readers' mark left makes the next writer wait for a reader)
  if marked then
    local writer = mark(KEYS[5])
    if mark(KEYS[6]) and not writer then return {-1, t[1], t[2], ''} end
    if writer then redis.call('DEL', KEYS[5]) end
  end
  if ARGV[2] == '0' then redis.call('SET', KEYS[1], ARGV[1])
  else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
  return {1, t[1], t[2], ''}
end
if n > 0 then
  local held = redis.call('HGET', KEYS[3], 'limit') or '0'
  if tonumber(held) ~= want then return {-4, t[1], t[2], held} end
  if want > 0 and n >= want then return {-1, t[1], t[2], first_shared(KEYS[3], KEYS[4])} end
end
if marked then
  if mark(KEYS[5]) then return {-1, t[1], t[2], ''} end
  if mark(KEYS[6]) then redis.call('DEL', KEYS[6]) end
end
local at = 'inf'
if ARGV[2] ~= '0' then at = string.format('%.0f', now + tonumber(ARGV[2]) * 1000) end
redis.call('ZADD', KEYS[4], at, tok)
redis.call('HSET', KEYS[3], tok, ARGV[1], 'limit', ARGV[4])
keep(KEYS[3], KEYS[4])
return {1, t[1], t[2], ''}
"
);

/// Whether a waiter subscribed to the release channel is still kept out, in the mode
/// `ARGV[1]` (as `ACQUIRE`'s): 0 it may try now; else how long (ms, at least 1) until
/// what keeps it out could lapse by itself (a lease, a mark), so that the waiter sleeps no
/// longer than that (a lapse sends no message), or -1 if nothing lapses by itself. The
/// waiter (one that sleeps: nobody else asks) marks the key for `ARGV[2]` ms: a writer
/// kept out by shared holds with the writer's mark (new shared holds wait behind it), a
/// reader or permit waiter kept out by a writer with the readers' mark (the next writer
/// waits until a shared hold got in). Run after subscribing: a release just before would
/// otherwise be missed. KEYS: the lock key, the shared holds' hash and leases, the
/// writer's mark, the readers' mark.
pub(crate) const BLOCKED: &str = concat!(
    shared_lua!(),
    r"
local function until_(ms)
  if ms == -1 then return -1 end
  return math.max(1, ms)
end
local function lease_left(at, now)
  if at == 'inf' then return -1 end
  return until_(math.ceil((tonumber(at) - now) / 1000))
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  if tonumber(ARGV[1]) >= 0 then
    if redis.replicate_commands then redis.replicate_commands() end
    redis.call('SET', KEYS[5], '1', 'PX', ARGV[2])
  end
  return until_(redis.call('PTTL', KEYS[1]))
end
if redis.replicate_commands then redis.replicate_commands() end
local now = clock()
local n = 0
if redis.call('EXISTS', KEYS[3]) == 1 then n = prune(KEYS[2], KEYS[3], now) end
local want = tonumber(ARGV[1])
if want < 0 then
  if n == 0 then
    if not mark(KEYS[5]) or mark(KEYS[4]) then return 0 end
    return until_(redis.call('PTTL', KEYS[5]))
  end
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[2])
  return lease_left(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2], now)
end
if n > 0 and tonumber(redis.call('HGET', KEYS[2], 'limit') or '0') ~= want then return 0 end
if mark(KEYS[4]) then return until_(redis.call('PTTL', KEYS[4])) end
if want > 0 and n >= want then
  return lease_left(redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2], now)
end
return 0
"
);

/// How many shared holds of the key stand now. KEYS: the shared holds' hash and leases.
pub(crate) const HELD: &str = concat!(
    shared_lua!(),
    r"
if redis.replicate_commands then redis.replicate_commands() end
return prune(KEYS[1], KEYS[2], clock())
"
);

/// Cancels an attempt whose outcome its maker never learned (a dropped future, a reply
/// that timed out): if the attempt took the key (or a shared hold of it), releases it (1)
/// and wakes the waiters; otherwise (0) leaves a marker (`KEYS[3]`) that refuses the
/// attempt should it still arrive, until the attempt's deadline (`ARGV[2]`, server µs) has
/// passed, for at most `ARGV[3]` ms. Whichever of the two the server runs first, no hold
/// is left behind. KEYS 4 and 5: the shared holds' hash and leases.
pub(crate) const CANCEL: &str = concat!(
    shared_lua!(),
    r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then
  drop_shared(KEYS[4], KEYS[5], ARGV[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if redis.replicate_commands then redis.replicate_commands() end
local keep = tonumber(ARGV[3])
if ARGV[2] ~= '0' then
  local now = clock()
  keep = math.min(keep, math.floor((tonumber(ARGV[2]) - now) / 1000) + 1)
end
if keep > 0 then redis.call('SET', KEYS[3], '1', 'PX', keep) end
return 0
"
);

/// Compare-and-delete, waking the waiters: 1 deleted, 2 already deleted by an earlier try
/// of this release (its reply was lost: `KEYS[3]`, the release's mark, lives `ARGV[2]` ms),
/// -1 not ours (the lease ran out, or the hold was broken or wiped, whoever holds the key
/// now). A shared hold (KEYS 4 and 5) is released the same way; one found with its lease
/// run out is removed and is not ours.
pub(crate) const RELEASE: &str = concat!(
    shared_lua!(),
    r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then
  if redis.replicate_commands then redis.replicate_commands() end
  local now = clock()
  local ours = live(KEYS[5], ARGV[1], now)
  drop_shared(KEYS[4], KEYS[5], ARGV[1])
  redis.call('PUBLISH', KEYS[2], '1')
  if not ours then return -1 end
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
  return 1
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
return -1
"
);

/// The fencing token of the current holder, -1 for anyone else: the token already written
/// into its value, or a new one, greater than the counter (`KEYS[2]`) and than the server's
/// clock in µs, so that a counter lost (an empty restart, a failover to a replica that
/// missed it, its expiry) never makes a token repeat or go back. The counter lives for the
/// hold's lease plus `ARGV[2]` ms. The token is written into the holder's value (after its
/// own token), for inspection and for the next ask. A shared holder (KEYS 3 and 4) takes
/// none: it reads the counter, the token of the last exclusive hold that took one, since
/// no exclusive hold stands beside it; a counter that lapsed is set to the server's clock
/// in µs first (above every earlier token, below every later one).
pub(crate) const TOKEN: &str = concat!(
    shared_lua!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  local now = clock()
  if not live(KEYS[4], ARGV[1], now) then return -1 end
  local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if last > 0 then return last end
  -- the counter lapsed: the clock is above every earlier token, and set as the counter it
  -- keeps the next one above this
  if redis.replicate_commands then redis.replicate_commands() end
  local s = string.format('%.0f', now)
  redis.call('SET', KEYS[2], s, 'PX', ARGV[2])
  return now
end
local rest = string.sub(v, 34)
local sp = string.find(rest, ' ', 1, true)
if sp then
  local have = tonumber(string.sub(rest, 1, sp - 1))
  if have and have > 0 then return have end
end
if redis.replicate_commands then redis.replicate_commands() end
local now = clock()
local prev = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local n = math.max(prev + 1, now)
local keep = tonumber(ARGV[2])
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then keep = keep + pttl end
local s = string.format('%.0f', n)
redis.call('SET', KEYS[2], s, 'PX', keep)
if sp then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. s .. string.sub(rest, sp), 'KEEPTTL')
end
return n
"
);

/// Compare-and-renew: 1 renewed, 0 no longer ours. A shared hold (KEYS 2 and 3) gets its
/// lease's end moved, if it has not passed.
pub(crate) const EXTEND: &str = concat!(
    shared_lua!(),
    r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  if ARGV[2] == '0' then redis.call('PERSIST', KEYS[1])
  else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return 1
end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
if redis.replicate_commands then redis.replicate_commands() end
local now = clock()
if not live(KEYS[3], ARGV[1], now) then
  prune(KEYS[2], KEYS[3], now)
  return 0
end
local at = 'inf'
if ARGV[2] ~= '0' then at = string.format('%.0f', now + tonumber(ARGV[2]) * 1000) end
redis.call('ZADD', KEYS[3], 'XX', at, ARGV[1])
keep(KEYS[2], KEYS[3])
return 1
"
);

/// Whether the hold is still ours: 1 if the key (or a live shared hold, KEYS 2 and 3)
/// holds our token, 0 otherwise.
pub(crate) const CHECK: &str = concat!(
    shared_lua!(),
    r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return 1 end
if live(KEYS[3], ARGV[1], clock()) then return 1 end
return 0
"
);

/// Turns an exclusive hold into a reader's, in one step: the lock key goes, and a shared
/// hold of the same token, value and lease takes its place; waiting readers are woken.
/// 1 done (or done already by an earlier try whose reply was lost), 0 not ours. Like any
/// shared take, it removes the readers' mark. KEYS: the lock key, its channel, the shared
/// holds' hash and leases, the readers' mark.
pub(crate) const DOWNGRADE: &str = concat!(
    shared_lua!(),
    r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  -- done already by an earlier try whose reply was lost: the token reads now
  if redis.call('HGET', KEYS[3], 'limit') == '0' and live(KEYS[4], ARGV[1], clock()) then
    return 1
  end
  return 0
end
if redis.replicate_commands then redis.replicate_commands() end
local now = clock()
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
prune(KEYS[3], KEYS[4], now)
local at = 'inf'
if pttl > 0 then at = string.format('%.0f', now + pttl * 1000) end
redis.call('ZADD', KEYS[4], at, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], v, 'limit', '0')
keep(KEYS[3], KEYS[4])
redis.call('DEL', KEYS[5])
redis.call('PUBLISH', KEYS[2], '1')
return 1
"
);

/// Breaks a lock, whoever holds it (every shared holder too, KEYS 3 and 4, and the marks,
/// KEYS 5 and 6), and wakes its waiters. Returns how many holds there were, then what
/// they were, read before they went: the lock key's value (or nil) and PTTL, the shared
/// holds' hash and leases (with their ends), the fence counter (KEYS 7, or nil) and the
/// server's TIME, which the leases' ends are measured against, and the lock key's TYPE.
/// A key of another type (someone else's) reads as absent, and is broken all the same.
pub(crate) const FORCE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local function read(empty, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then return empty end
  return r
end
local v = read(false, 'GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
local shared = read({}, 'HGETALL', KEYS[3])
local leases = read({}, 'ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
local fence = read(false, 'GET', KEYS[7])
local t = redis.call('TIME')
local kind = redis.call('TYPE', KEYS[1])['ok']
local n = redis.call('DEL', KEYS[1]) + read(0, 'ZCARD', KEYS[4])
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('PUBLISH', KEYS[2], '1')
return {n, v, pttl, shared, leases, fence, t, kind}
";

/// Breaks the holds of one process (`ARGV[1]`, its pid, on the host `ARGV[2]`, as their
/// values name them): the exclusive one and every shared one, waking the waiters. How
/// many it broke. KEYS: the lock key, its channel, the shared holds' hash and leases.
pub(crate) const FORCE_PROCESS: &str = concat!(
    shared_lua!(),
    r"
local function ours(v)
  local _, _, pid, host = string.find(v, '^%S+ %S+ (%S+) %S+ (.*)$')
  return pid == ARGV[1] and host == ARGV[2]
end
local n = 0
local v = redis.call('GET', KEYS[1])
if v and ours(v) then
  redis.call('DEL', KEYS[1])
  n = n + 1
end
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  if all[i] ~= 'limit' and ours(all[i + 1]) then
    drop_shared(KEYS[3], KEYS[4], all[i])
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', KEYS[2], '1') end
return n
"
);

/// A script, sent as `EVALSHA` by its hash, or whole (`EVAL`) when the server has not got it
/// cached (`NOSCRIPT`: a restarted or promoted server). Not `SCRIPT LOAD` and then `EVALSHA`,
/// as redis-rs's `Script` does: one round trip fewer, and each request is held to the
/// caller's deadline by the caller (see `topology::Req`).
#[derive(Debug)]
pub(crate) struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: &'static str) -> Lua {
        Lua {
            code,
            hash: redis::Script::new(code).get_hash().to_string(),
        }
    }

    /// A call of the script, to be given its keys, then its arguments.
    pub(crate) fn call(&self) -> Call<'_> {
        Call {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Lua`] script.
pub(crate) struct Call<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    pub(crate) fn key(mut self, key: impl redis::ToRedisArgs) -> Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA` (`whole`: `EVAL`) with the keys and arguments.
    pub(crate) fn cmd(&self, whole: bool) -> redis::Cmd {
        let mut c = if whole {
            let mut c = redis::cmd("EVAL");
            c.arg(self.lua.code);
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&self.lua.hash);
            c
        };
        c.arg(self.keys.len()).arg(&self.keys).arg(&self.args);
        c
    }

    /// The call on an async connection: by hash, then whole if the server lacks the script.
    #[cfg(feature = "tokio")]
    pub(crate) async fn invoke_async<T: redis::FromRedisValue>(
        &self,
        con: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match self.cmd(false).query_async(con).await {
            Err(e) if e.code() == Some("NOSCRIPT") => self.cmd(true).query_async(con).await,
            other => other,
        }
    }
}
