//! The server-side scripts. Each touches only keys of one cluster hash tag (the lock key,
//! its fence counter and its release channel share `PREFIX{KEY}`), so a Cluster runs each
//! on the master of that slot. A hold is recognised by the first 32 characters of the lock
//! key's value, its token (see `identity`).

/// Compare-and-delete, waking the waiters: 1 deleted, 0 absent (expired, or deleted by an
/// earlier try whose reply was lost), -1 held by someone else.
pub(crate) const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if not v then return 0 end
return -1
";

/// The fencing token, only for the current holder: the counter's next value, or 0. The
/// token is also written into the holder's value (after its own token), for inspection.
pub(crate) const TOKEN: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then return 0 end
local n = redis.call('INCR', KEYS[2])
local rest = string.sub(v, 34)
local sp = string.find(rest, ' ', 1, true)
if sp then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. n .. string.sub(rest, sp), 'KEEPTTL')
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

/// Breaks a lock, whoever holds it, and wakes its waiters: 1 if it was held.
pub(crate) const FORCE: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], '1')
return n
";
