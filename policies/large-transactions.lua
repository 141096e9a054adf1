-- large-transactions: a content filter.
--
-- Only posted transactions of 1000 or more reach the destination; every
-- other event the subscription's event types matched is dropped before its
-- first attempt (counted in streaming_hub_policy_filtered_total).  A payload
-- that is not JSON, or has no numeric amount, does not match.
--
--   "event_types": ["transaction.*"], "policy": "large-transactions"
return {
  match = function(ev)
    if ev.event_type ~= "transaction.posted" then
      return false
    end
    local data = ev.data
    return type(data) == "table" and type(data.amount) == "number" and data.amount >= 1000
  end,
}
