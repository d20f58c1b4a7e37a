-- wrk script: POSTs GraphQL requests read from a file and checks every answer.
--
--   wrk -s graphql.lua URL -- BODIES RUN [BAD] [MUST]
--
-- BODIES: a file with one JSON request body per line; each request picks a
--   line at random. Every `@K@` in a line is replaced by a new UUID-shaped
--   key per request: RUN (8 hex digits), the thread and a counter, so no two
--   requests of a run (or of runs with different RUN) write the same key.
-- BAD: `|`-separated substrings that make an answer a failure (besides
--   `"errors"`, which always does); MUST: a substring every answer needs.
--
-- done() prints one line `RESULT {json}` with requests/s, latency
-- percentiles (microseconds) and the failures, and the first failed answer.

local threads = {}

function setup(thread)
  thread:set("thread_no", #threads + 1)
  table.insert(threads, thread)
end

local function split_plain(s, sep)
  local parts, from = {}, 1
  while true do
    local i, j = string.find(s, sep, from, true)
    if not i then
      table.insert(parts, string.sub(s, from))
      return parts
    end
    table.insert(parts, string.sub(s, from, i - 1))
    from = j + 1
  end
end

function init(args)
  local path = args[1]
  run = tonumber(args[2] or "0") or 0
  bad = {}
  if args[3] and args[3] ~= "" then bad = split_plain(args[3], "|") end
  must = args[4]
  if must == "" then must = nil end
  thread_no = thread_no or 1
  math.randomseed(run * 1000 + thread_no)
  local headers = { ["Content-Type"] = "application/json", ["Accept"] = "application/json" }
  templates, fixed = {}, {}
  for line in io.lines(path) do
    if #line > 0 then
      local parts = split_plain(line, "@K@")
      if #parts == 1 then
        table.insert(fixed, wrk.format("POST", nil, headers, line))
      else
        table.insert(templates, parts)
      end
    end
  end
  if #fixed == 0 and #templates == 0 then error("no request bodies in " .. tostring(path)) end
  req_headers = headers
  seq = 0
  answers, non2xx, gql_errors, bad_answers = 0, 0, 0, 0
  first_failure = ""
end

local function key()
  seq = seq + 1
  return string.format("%08x-%04x-4000-8000-%012x", run % 4294967296, thread_no, seq)
end

function request()
  if #templates == 0 then
    return fixed[math.random(#fixed)]
  end
  local t = templates[math.random(#templates)]
  local out = {}
  for i = 1, #t - 1 do
    out[#out + 1] = t[i]
    out[#out + 1] = key()
  end
  out[#out + 1] = t[#t]
  return wrk.format("POST", nil, req_headers, table.concat(out))
end

local function failed(kind, status, body)
  if first_failure == "" then
    first_failure = kind .. " " .. status .. ": " .. string.sub(body or "", 1, 400)
  end
end

function response(status, headers, body)
  answers = answers + 1
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    failed("status", status, body)
    return
  end
  if string.find(body, '"errors"', 1, true) then
    gql_errors = gql_errors + 1
    failed("graphql-error", status, body)
    return
  end
  for _, s in ipairs(bad) do
    if string.find(body, s, 1, true) then
      bad_answers = bad_answers + 1
      failed("bad-answer", status, body)
      return
    end
  end
  if must and not string.find(body, must, 1, true) then
    bad_answers = bad_answers + 1
    failed("bad-answer", status, body)
  end
end

local function json_string(s)
  s = string.gsub(s, '[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    return string.format("\\u%04x", string.byte(c))
  end)
  return '"' .. s .. '"'
end

function done(summary, latency, requests)
  local n2, ge, ba, an, first = 0, 0, 0, 0, ""
  for _, t in ipairs(threads) do
    n2 = n2 + (t:get("non2xx") or 0)
    ge = ge + (t:get("gql_errors") or 0)
    ba = ba + (t:get("bad_answers") or 0)
    an = an + (t:get("answers") or 0)
    if first == "" then first = t:get("first_failure") or "" end
  end
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    'RESULT {"requests":%d,"answers_checked":%d,"seconds":%.3f,"rps":%.1f,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f,'
      .. '"non2xx":%d,"graphql_errors":%d,"bad_answers":%d,'
      .. '"socket_errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
      .. '"first_failure":%s}\n',
    summary.requests, an, seconds, summary.requests / seconds,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    n2, ge, ba, e.connect, e.read, e.write, e.status, e.timeout, json_string(first)))
end
