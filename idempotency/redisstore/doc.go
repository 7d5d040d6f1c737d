// Package redisstore is a dedupe.Store on Redis.
package redisstore
