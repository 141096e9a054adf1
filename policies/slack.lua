-- slack: turns an event into a Slack incoming-webhook message.
--
-- Slack wants {"text": ..., "blocks": [...]}, not the raw event.  The shaped
-- body is what gets signed and sent; the X-Lerian-* and ce-* headers still
-- describe the original event.
local function money(v)
  if type(v) ~= "number" then
    return tostring(v)
  end
  return string.format("%.2f", v)
end

return {
  shape = function(ev)
    local d = type(ev.data) == "table" and ev.data or {}
    local line = string.format("*%s* from `%s`", ev.event_type, ev.source)
    if d.amount ~= nil then
      line = line .. string.format(" — amount %s %s", money(d.amount), d.currency or "")
    end
    return {
      text = line,
      blocks = {
        { type = "section", text = { type = "mrkdwn", text = line } },
        {
          type = "context",
          elements = {
            { type = "mrkdwn", text = "tenant " .. ev.tenant .. " · event " .. ev.id },
          },
        },
      },
    }, { ["X-Slack-No-Retry"] = "1" }
  end,
}
