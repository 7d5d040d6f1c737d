package redisstore

import "github.com/redis/go-redis/v9"

// The store's state lives in these keys, each named by Config.Prefix (P)
// and a suffix:
//
//	P g           hash: epoch, fence (ms), n (entries), b (bytes), and
//	              the counters of Stats
//	P m           hash: token -> "size idlen id key" of every entry
//	P d           sorted set: completed tokens by completion time (ms)
//	P l           sorted set: tokens in flight by lease end (ms)
//	P i:<id>      sorted set: an identity's completed tokens by completion time
//	P in, P ib    hashes: identity -> entries, identity -> bytes
//	P e:<n>:<id><key>  hash of one entry (n is len(id), so that no two
//	              scopes share a name): t token, s state ("f" in flight,
//	              "d" done), m method, h request hash, l lease end,
//	              c completion time, z size, r record, k tombstone, w a
//	              waiter waits, n the nonce of the Complete that completed it
//
// Every script starts with the prelude: it reads the time from Redis's
// clock (TIME), in milliseconds, so that every time the store compares is
// on one clock whichever replica runs the script (a test passes its own
// clock's time instead); then it reads the epoch, and creates it (with a
// fence) when the store's state is gone.

// argv indexes of the common header (Lua is 1-based).
const (
	argPrefix = iota
	argNow
	argNewEpoch
	argFence
	argIDBase
	argIDPerByte
	argTTL
	argHorizon
	argMaxEntries
	argMaxPerID
	argMaxBytes
	argMaxBytesPerID
	argGrace
	argBusy
	headerLen
)

const prelude = `
local P = ARGV[1]
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local G, E = KEYS[1], KEYS[2]
local M, D, L, IN, IB = P..'m', P..'d', P..'l', P..'in', P..'ib'
local ttl, horizon = tonumber(ARGV[7]), tonumber(ARGV[8])
local maxN, maxNID = tonumber(ARGV[9]), tonumber(ARGV[10])
local maxB, maxBID = tonumber(ARGV[11]), tonumber(ARGV[12])
local grace, busy = tonumber(ARGV[13]), tonumber(ARGV[14])
local A = 14

local function idcost(id) return tonumber(ARGV[5]) + tonumber(ARGV[6]) * #id end
local function ikey(id) return P..'i:'..id end
local function ekey(id, key) return P..'e:'..#id..':'..id..key end

local g = redis.call('HMGET', G, 'epoch', 'fence')
local epoch, fenceEnd = g[1], tonumber(g[2])
if not epoch then
  epoch = ARGV[3]
  fenceEnd = now + tonumber(ARGV[4])
  redis.call('HSET', G, 'epoch', epoch, 'fence', fenceEnd, 'n', 0, 'b', 0)
end

local function meta(size, id, key) return size..' '..#id..' '..id..key end
local function parse(m)
  local a = string.find(m, ' ', 1, true)
  local b = string.find(m, ' ', a + 1, true)
  local n = tonumber(string.sub(m, a + 1, b - 1))
  return tonumber(string.sub(m, 1, a - 1)), string.sub(m, b + 1, b + n), string.sub(m, b + n + 1)
end

local function drop(tok)
  redis.call('ZREM', D, tok)
  redis.call('ZREM', L, tok)
  local m = redis.call('HGET', M, tok)
  if not m then return end
  redis.call('HDEL', M, tok)
  local size, id, key = parse(m)
  redis.call('ZREM', ikey(id), tok)
  local ek = ekey(id, key)
  if redis.call('HGET', ek, 't') == tok then redis.call('DEL', ek) end
  redis.call('HINCRBY', G, 'n', -1)
  redis.call('HINCRBY', G, 'b', -size)
  redis.call('HINCRBY', IB, id, -size)
  if redis.call('HINCRBY', IN, id, -1) <= 0 then
    redis.call('HDEL', IN, id)
    redis.call('HDEL', IB, id)
    redis.call('DEL', ikey(id))
    redis.call('HINCRBY', G, 'b', -idcost(id))
  end
end

local function expire()
  local old = redis.call('ZRANGEBYSCORE', D, '-inf', now - ttl, 'LIMIT', 0, 100)
  for _, tok in ipairs(old) do drop(tok) end
  if #old > 0 then redis.call('HINCRBY', G, 'ex', #old) end
  local ended = redis.call('ZRANGEBYSCORE', L, '-inf', now, 'LIMIT', 0, 100)
  for _, tok in ipairs(ended) do drop(tok) end
  if #ended > 0 then redis.call('HINCRBY', G, 'le', #ended) end
end

local function evictOldest(z)
  local o = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if #o == 0 then return busy end
  if horizon > 0 then
    local wait = tonumber(o[2]) + horizon - now
    if wait > 0 then return wait end
  end
  drop(o[1])
  redis.call('HINCRBY', G, 'ev', 1)
  return nil
end

local function idcounts(id)
  local c = redis.call('HMGET', IN, id)
  if not c[1] then return nil, nil end
  return tonumber(c[1]), tonumber(redis.call('HGET', IB, id))
end

local function counts()
  local c = redis.call('HMGET', G, 'n', 'b')
  return tonumber(c[1]), tonumber(c[2])
end

-- room evicts completed records until id can take n more entries and size
-- more bytes within its share, and the store n more entries and total more
-- bytes; it returns nil, or {wait, reason} when a record younger than the
-- horizon (or an entry in flight) holds the room. It counts evictions, not
-- refusals: a refused claim counts as busy or quota, a record that does not
-- fit as ov.
local function room(id, n, size, total)
  local idn, idb = idcounts(id)
  if idn then
    while idn + n > maxNID or idb + size > maxBID do
      local w = evictOldest(ikey(id))
      if w then return {w, 'q'} end
      idn, idb = idcounts(id)
      if not idn then idn, idb = 0, 0 end
    end
  elseif n > maxNID or size > maxBID then
    return {busy, 'q'}
  end
  local gn, gb = counts()
  while gn + n > maxN or gb + total > maxB do
    local w = evictOldest(D)
    if w then return {w, 'b'} end
    gn, gb = counts()
  end
  return nil
end

local function create(tok, id, key, method, hash, leaseEnd, size)
  if not redis.call('HGET', IN, id) then
    redis.call('HSET', IN, id, 0)
    redis.call('HSET', IB, id, 0)
    redis.call('HINCRBY', G, 'b', idcost(id))
  end
  redis.call('HSET', E, 't', tok, 's', 'f', 'm', method, 'h', hash, 'l', leaseEnd, 'z', size)
  redis.call('PEXPIRE', E, leaseEnd - now + grace)
  redis.call('ZADD', L, leaseEnd, tok)
  redis.call('HSET', M, tok, meta(size, id, key))
  redis.call('HINCRBY', G, 'n', 1)
  redis.call('HINCRBY', G, 'b', size)
  redis.call('HINCRBY', IN, id, 1)
  redis.call('HINCRBY', IB, id, size)
end
`

// claimScript: ARGV after the header: identity, key, method, hash, token,
// lease (ms, from now), entry size. Replies:
//
//	{"O", epoch, lease end}               owned
//	{"F", epoch, token, method, hash}     in flight
//	{"D", epoch, token, method, hash, record, tombstone}
//	{"X", epoch, ms}                      fenced for ms more
//	{"R", epoch, ms, "q"|"b"}             no room: quota or store
var claimScript = redis.NewScript("#!lua\n" + prelude + `
local id, key, method, hash = ARGV[A+1], ARGV[A+2], ARGV[A+3], ARGV[A+4]
local tok, leaseEnd, size = ARGV[A+5], now + tonumber(ARGV[A+6]), tonumber(ARGV[A+7])
expire()
local e = redis.call('HMGET', E, 't', 's', 'm', 'h', 'c', 'r', 'k', 'l')
if e[1] then
  if e[2] == 'f' then
    if e[1] == tok then return {'O', epoch, tonumber(e[8])} end
    return {'F', epoch, e[1], e[3], e[4]}
  end
  if now < tonumber(e[5]) + ttl then
    return {'D', epoch, e[1], e[3], e[4], e[6] or '', e[7] or ''}
  end
  drop(e[1])
  redis.call('HINCRBY', G, 'ex', 1)
end
if now < fenceEnd then
  redis.call('HINCRBY', G, 'fenced', 1)
  return {'X', epoch, fenceEnd - now}
end
local total = size
if not redis.call('HGET', IN, id) then total = total + idcost(id) end
local r = room(id, 1, size, total)
if r then
  if r[2] == 'q' then redis.call('HINCRBY', G, 'quota', 1) else redis.call('HINCRBY', G, 'busy', 1) end
  return {'R', epoch, r[1], r[2]}
end
create(tok, id, key, method, hash, leaseEnd, size)
return {'O', epoch, leaseEnd}
`)

// completeScript: ARGV after the header: token, the claim's epoch,
// identity, key, method, hash, lease end, entry size, record, record
// size, channel. Replies {"C", epoch, tombstoned 0|1} or {"E", epoch,
// why}. The header's new-epoch argument is the call's nonce, kept in the
// entry ("n"): the same call run again (a client retry after a lost reply)
// succeeds, another Complete of the claim fails. A claim lost with the store's data (its epoch is not the
// current one) and whose lease has not ended is taken back first.
var completeScript = redis.NewScript("#!lua flags=allow-oom\n" + prelude + `
local tok, cepoch = ARGV[A+1], ARGV[A+2]
local id, key, method, hash = ARGV[A+3], ARGV[A+4], ARGV[A+5], ARGV[A+6]
local leaseEnd, size = tonumber(ARGV[A+7]), tonumber(ARGV[A+8])
local rec, recSize, chan = ARGV[A+9], tonumber(ARGV[A+10]), ARGV[A+11]
expire()
local e = redis.call('HMGET', E, 't', 's', 'w', 'z', 'n')
if e[1] then
  if e[1] == tok and e[2] == 'd' and e[5] == ARGV[3] then return {'C', epoch, 0} end
  if e[1] ~= tok or e[2] ~= 'f' then return {'E', epoch, 'finished'} end
elseif cepoch == epoch or now >= leaseEnd then
  return {'E', epoch, 'released, or its lease ended'}
else
  create(tok, id, key, method, hash, leaseEnd, size)
  redis.call('HINCRBY', G, 'retaken', 1)
  e = {tok, 'f', false, tostring(size)}
end
local cur = tonumber(e[4])
local grow, tomb = recSize, 0
if cur + grow > maxBID or room(id, 0, grow, grow) then
  grow, tomb = 0, 1
  redis.call('HINCRBY', G, 'ov', 1)
end
redis.call('HSET', E, 's', 'd', 'c', now, 'z', cur + grow, 'n', ARGV[3])
redis.call('HDEL', E, 'l', 'w')
if tomb == 1 then redis.call('HSET', E, 'k', 1) else redis.call('HSET', E, 'r', rec) end
redis.call('PEXPIRE', E, ttl + grace)
redis.call('ZREM', L, tok)
redis.call('ZADD', D, now, tok)
redis.call('ZADD', ikey(id), now, tok)
redis.call('HSET', M, tok, meta(cur + grow, id, key))
redis.call('HINCRBY', G, 'b', grow)
redis.call('HINCRBY', IB, id, grow)
if e[3] then redis.call('PUBLISH', chan, tok) end
return {'C', epoch, tomb}
`)

// releaseScript: ARGV after the header: token, the claim's epoch,
// channel. Replies {"C", epoch} or {"E", epoch}.
var releaseScript = redis.NewScript("#!lua flags=allow-oom\n" + prelude + `
local tok, cepoch, chan = ARGV[A+1], ARGV[A+2], ARGV[A+3]
expire()
local e = redis.call('HMGET', E, 't', 's', 'w')
if e[1] == tok and e[2] == 'f' then
  drop(tok)
  if e[3] then redis.call('PUBLISH', chan, tok) end
  return {'C', epoch}
end
if not e[1] and cepoch ~= epoch then return {'C', epoch} end
return {'E', epoch}
`)

// waitScript: ARGV after the header: the awaited token, the claim's
// epoch. Replies {"D", epoch, record, tombstone}, {"W", epoch, ms} (still
// in flight, or maybe about to be taken back after a loss of data, for at
// most ms), or {"N", epoch} (released, or its lease ended).
var waitScript = redis.NewScript("#!lua flags=allow-oom\n" + prelude + `
local tok, cepoch = ARGV[A+1], ARGV[A+2]
local e = redis.call('HMGET', E, 't', 's', 'l', 'r', 'k')
if e[1] == tok then
  if e[2] == 'f' then
    local lease = tonumber(e[3])
    if now >= lease then
      drop(tok)
      redis.call('HINCRBY', G, 'le', 1)
      return {'N', epoch}
    end
    redis.call('HSET', E, 'w', 1)
    return {'W', epoch, lease - now}
  end
  return {'D', epoch, e[4] or '', e[5] or ''}
end
if not e[1] and cepoch ~= epoch and now < fenceEnd then return {'W', epoch, fenceEnd - now} end
return {'N', epoch}
`)

// retakeScript takes an owned claim lost with the store's data back.
// ARGV after the header: token, identity, key, method, hash, lease end,
// entry size. Replies {"C", epoch} (held) or {"E", epoch} (another holds
// the scope, or the lease ended).
var retakeScript = redis.NewScript("#!lua flags=allow-oom\n" + prelude + `
local tok, id, key, method, hash = ARGV[A+1], ARGV[A+2], ARGV[A+3], ARGV[A+4], ARGV[A+5]
local leaseEnd, size = tonumber(ARGV[A+6]), tonumber(ARGV[A+7])
local t = redis.call('HGET', E, 't')
if t == tok then return {'C', epoch} end
if t or now >= leaseEnd then return {'E', epoch} end
create(tok, id, key, method, hash, leaseEnd, size)
redis.call('HINCRBY', G, 'retaken', 1)
return {'C', epoch}
`)
