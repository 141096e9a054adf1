-- internal-fast-retry: an aggressive retry schedule for an internal sink.
--
-- An internal service comes back within minutes, not hours: retry quickly,
-- a few times, and dead-letter early instead of holding events for 28 hours.
-- Client errors other than 408 and 429 will not get better by retrying, so
-- they go to the dead letters at once (false), to be redelivered by hand
-- once the consumer is fixed.  Everything else follows the schedule below
-- (full jitter applies to a schedule, as to the default curve).
local schedule = { "1s", "5s", "15s", "1m", "5m" }

return {
  retry = function(ctx)
    local s = ctx.status
    if s and s >= 400 and s < 500 and s ~= 408 and s ~= 429 then
      return false
    end
    if ctx.attempt > #schedule then
      return false
    end
    return schedule[ctx.attempt]
  end,
}
