//! The subcommands against Redis: the --redis URLs (with a password from $REDISCLI_AUTH,
//! redacted when printed), the topology they name, and each subcommand on the locks there.

use shmlock::RedisLocks;
use std::os::unix::ffi::OsStrExt;

use crate::args::Cmd;
use crate::exit::{Fail, EX_USAGE};
use crate::inspect::{inspect, Inspected};
use crate::run::run;
use crate::unlock::unlock_redis;

/// What the --redis URLs name.
pub enum Topology<'a> {
    Single,
    Cluster,
    Sentinel(&'a str),
}

/// `url` with the password from $REDISCLI_AUTH if it has none (as redis-cli does), so a
/// password need not be on the command line. URLs that do not parse are left as they are
/// (opening them reports why).
fn with_env_password(url: &str) -> String {
    let Ok(password) = std::env::var("REDISCLI_AUTH") else {
        return url.to_string();
    };
    match redis::parse_redis_url(url) {
        Some(mut parsed) if parsed.password().is_none() => {
            if parsed.set_password(Some(&password)).is_ok() {
                parsed.to_string()
            } else {
                url.to_string()
            }
        }
        _ => url.to_string(),
    }
}

/// `url` for printing: any password replaced by `***`.
fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let user = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => userinfo.to_string(),
    };
    format!("{}{user}{}", &url[..scheme_end + 3], &rest[at..])
}

/// A usage error unless `url` is a Redis URL this build can use (a malformed one is the
/// command line's fault, not the server's).
fn check_url(url: &str) -> Result<(), Fail> {
    match redis::IntoConnectionInfo::into_connection_info(url) {
        Ok(_) => Ok(()),
        Err(e) => Err(Fail(
            format!(
                "--redis {:?} is not a Redis URL this build can use ({}): give \
                 redis://[:PASSWORD@]HOST[:PORT][/DB] (rediss:// for TLS, with the redis-tls \
                 feature; several, comma-separated, with --redis-cluster or --redis-sentinel)",
                redact_url(url),
                e.to_string().replace(" - InvalidClientConfig", "")
            ),
            EX_USAGE,
        )),
    }
}

/// The usage errors of `command` against Redis that need no server to tell (`run`'s are
/// `run::check_args`'s).
pub fn usage(command: &Cmd) -> Result<(), Fail> {
    match command {
        Cmd::Stats(_) => Err(Fail(
            "stats: a Redis handle's counters are kept by the process that uses it \
             (RedisLocks::stats); the server keeps none"
                .into(),
            EX_USAGE,
        )),
        Cmd::Create(_) => Err(Fail(
            "create makes table and dict files; a Redis server needs no creating".into(),
            EX_USAGE,
        )),
        Cmd::Inspect(a) if a.all => Err(crate::inspect::all_is_for_tables()),
        Cmd::Unlock(a) => crate::unlock::refuse_without_force(a).map(|_| ()),
        _ => Ok(()),
    }
}

/// Opens the locks `url` names and runs `command` on them.
pub fn dispatch(url: &str, topology: Topology<'_>, prefix: &str, command: Cmd) -> Result<u8, Fail> {
    for one in url.split(',') {
        check_url(one)?;
    }
    if matches!(topology, Topology::Single) && url.contains(',') {
        return Err(Fail(
            format!(
                "--redis {:?} names several servers: add --redis-cluster (they are nodes of \
                 a Redis Cluster) or --redis-sentinel MASTER (they are sentinels), or give \
                 one URL",
                url.split(',').map(redact_url).collect::<Vec<_>>().join(",")
            ),
            EX_USAGE,
        ));
    }
    let shown: Vec<String> = url.split(',').map(redact_url).collect();
    let shown = shown.join(",");
    // From here on, an error from there names the server.
    crate::exit::using_redis(shown.clone());
    let urls: Vec<String> = url.split(',').map(with_env_password).collect();
    let redis = match topology {
        Topology::Single => RedisLocks::open(&urls[0])?, // (the only one: see above)
        // (a plain server: the library names its own call; here the flag is the mistake)
        Topology::Cluster => RedisLocks::open_cluster(&urls).map_err(|e| match e {
            shmlock::Error::Redis(r) if r.kind() == redis::ErrorKind::InvalidClientConfig => Fail(
                format!(
                    "{shown}: not a Redis Cluster node ({}): without --redis-cluster, a URL \
                     names a single server",
                    r.detail().unwrap_or_default()
                ),
                EX_USAGE,
            ),
            e => e.into(),
        })?,
        Topology::Sentinel(master) => RedisLocks::open_sentinel(master, &urls)?,
    }
    .with_prefix(prefix);
    match command {
        Cmd::Run(a) => match (a.shared, a.permits) {
            (true, _) => run(redis.shared(), a),
            (false, Some(n)) => {
                let sem = redis.semaphore(a.key.as_bytes(), n).map_err(|e| match e {
                    shmlock::Error::InvalidOptions(_) => {
                        Fail("--permits must be at least 1".into(), EX_USAGE)
                    }
                    e => Fail::from(e),
                })?;
                run(&sem, a)
            }
            (false, None) => run(&redis, a),
        },
        Cmd::Inspect(a) => inspect(&Inspected::Redis(redis, shown), &a),
        Cmd::Unlock(a) => unlock_redis(&redis, prefix, a),
        Cmd::Stats(_) | Cmd::Create(_) => usage(&command).map(|()| 0),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_in_urls_are_redacted_and_the_rest_kept() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
            ("rediss://user:p%40ss@h:1/", "rediss://user:***@h:1/"),
            ("redis://user@h:1/", "redis://user@h:1/"),
            ("redis://:a@b@h:1/?x=@", "redis://:***@h:1/?x=@"),
            ("redis://:pw@h", "redis://:***@h"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
