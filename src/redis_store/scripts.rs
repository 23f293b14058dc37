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

/// Takes the key for a new hold, unless the attempt came too late: `{1, s, us, ''}` taken,
/// `{0, s, us, who}` held by someone (`who`: the holder's value past its token, for the
/// error of a wait that gives up; the token itself stays on the server), `{-2, s, us, ''}` refused because the server runs it after the
/// attempt's deadline (`ARGV[3]`, server µs; `0`: none), `{-3, s, us}` refused because the
/// attempt was cancelled before it arrived (its marker, `KEYS[2]`, exists). `s`, `us`: the
/// server's clock when it ran. An attempt that finds the key already holding its own token
/// (the same request delivered twice: redis-rs's cluster connection sends a request again
/// after a timeout) is told it took the key, so the hold is never left without its asker.
pub(crate) const ACQUIRE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == string.sub(ARGV[1], 1, 32) then return {1, t[1], t[2], ''} end
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[3] ~= '0' and now > tonumber(ARGV[3]) then return {-2, t[1], t[2], ''} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {-3, t[1], t[2], ''} end
if v then return {0, t[1], t[2], string.sub(v, 34)} end
if ARGV[2] == '0' then redis.call('SET', KEYS[1], ARGV[1])
else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
return {1, t[1], t[2], ''}
";

/// Cancels an attempt whose outcome its maker never learned (a dropped future, a reply
/// that timed out): if the attempt took the key, releases it (1) and wakes the waiters;
/// otherwise (0) leaves a marker (`KEYS[3]`) that refuses the attempt should it still
/// arrive, until the attempt's deadline (`ARGV[2]`, server µs) has passed, for at most
/// `ARGV[3]` ms. Whichever of the two the server runs first, no hold is left behind.
pub(crate) const CANCEL: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if redis.replicate_commands then redis.replicate_commands() end
local keep = tonumber(ARGV[3])
if ARGV[2] ~= '0' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  keep = math.min(keep, math.floor((tonumber(ARGV[2]) - now) / 1000) + 1)
end
if keep > 0 then redis.call('SET', KEYS[3], '1', 'PX', keep) end
return 0
";

/// Compare-and-delete, waking the waiters: 1 deleted, 2 already deleted by an earlier try
/// of this release (its reply was lost: `KEYS[3]`, the release's mark, lives `ARGV[2]` ms),
/// -1 not ours (the lease ran out, or the hold was broken or wiped, whoever holds the key
/// now).
pub(crate) const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
return -1
";

/// The fencing token of the current holder (0 for anyone else): the token already written
/// into its value, or a new one, greater than the counter (`KEYS[2]`) and than the server's
/// clock in µs, so that a counter lost (an empty restart, a failover to a replica that
/// missed it, its expiry) never makes a token repeat or go back. The counter lives for the
/// hold's lease plus `ARGV[2]` ms. The token is written into the holder's value (after its
/// own token), for inspection and for the next ask.
pub(crate) const TOKEN: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then return 0 end
local rest = string.sub(v, 34)
local sp = string.find(rest, ' ', 1, true)
if sp then
  local have = tonumber(string.sub(rest, 1, sp - 1))
  if have and have > 0 then return have end
end
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
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
";

/// Compare-and-renew: 1 renewed, 0 no longer ours.
pub(crate) const EXTEND: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then redis.call('PERSIST', KEYS[1])
else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
";

/// Whether the hold is still ours: 1 if the key holds our token (so its lease has not run
/// out), 0 otherwise.
pub(crate) const CHECK: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then return 1 end
return 0
";

/// Breaks a lock, whoever holds it, and wakes its waiters: 1 if it was held.
pub(crate) const FORCE: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], '1')
return n
";

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
