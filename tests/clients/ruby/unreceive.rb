# The gem's Connection#unreceive: put a received message back by re-publishing it with its
# headers copied (retry_count + 1), in a transaction of the gem's own (BEGIN, [ACK,] SEND,
# COMMIT). The gem ACKs the original in that transaction only on a `reliable` connection
# subscribed with ack client; on this plain one (--ack auto|client) it does not, and with
# --ack client the ACK of the copy (cumulative) covers the original too.
#
# Session 1: SEND m0 (header x-app) with a receipt; SUBSCRIBE with --ack; take m0;
# unreceive it; take the copy (ACK it if not auto); SEND the marker "end1" and take every
# MESSAGE up to it. DISCONNECT. Session 2: SUBSCRIBE ack auto, SEND "end2", take every
# MESSAGE up to it (what is left on the queue).
# Result: {"received": [...], "copy": {...}, "after": [...], "left": [...]}.

require_relative 'common'

opts = OtherClient.options(ack: 'auto')
OtherClient.run('unreceive', opts[:timeout]) do |result|
  dest = opts[:dest]
  acking = opts[:ack] != 'auto'
  first = OtherClient::Session.new(opts, result)
  conn = first.conn
  first.with_receipt('x-app' => 'keep', 'persistent' => 'true') { |h| conn.publish(dest, 'm0', h) }
  first.with_receipt('id' => 's1', 'ack' => opts[:ack]) { |h| conn.subscribe(dest, h) }
  original = first.message
  result['received'] = [OtherClient.describe(original)]
  conn.unreceive(original)
  copy = first.message
  result['copy'] = OtherClient.describe(copy)
  conn.ack(copy.headers['ack']) if acking
  first.with_receipt { |h| conn.publish(dest, 'end1', h) }
  result['after'] = first.until_marker('end1', ack: acking).map { |m| OtherClient.describe(m) }
  first.close

  second = OtherClient::Session.new(opts, result)
  second.with_receipt('id' => 's2', 'ack' => 'auto') { |h| second.conn.subscribe(dest, h) }
  second.with_receipt { |h| second.conn.publish(dest, 'end2', h) }
  result['left'] = second.until_marker('end2').map { |m| OtherClient.describe(m) }
  second.close
end
