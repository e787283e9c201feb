# A transaction committed and one aborted, each with a SEND and an ACK in it.
#
# Session 1: SEND m0, m1; SUBSCRIBE client-individual; take m0 and m1. BEGIN tx1, SEND t1 in
# tx1, ACK m0 in tx1, COMMIT tx1 (receipt). BEGIN tx2, SEND t2 in tx2, ACK m1 in tx2, ABORT
# tx2 (receipt). SEND the marker "end1" and take (and ACK) every MESSAGE up to it: t1, never
# t2. DISCONNECT. Session 2: SUBSCRIBE ack auto, SEND "end2", take every MESSAGE up to it:
# m1 (its ACK was aborted), never m0 (its ACK was committed).
# Result: {"received": [...], "after": [...], "left": [...]}.

require_relative 'common'

opts = OtherClient.options
OtherClient.run('transaction', opts[:timeout]) do |result|
  dest = opts[:dest]
  first = OtherClient::Session.new(opts, result)
  conn = first.conn
  conn.publish(dest, 'm0', 'persistent' => 'true')
  first.with_receipt('persistent' => 'true') { |h| conn.publish(dest, 'm1', h) }
  first.with_receipt('id' => 's1', 'ack' => 'client-individual') { |h| conn.subscribe(dest, h) }
  m0 = first.message
  m1 = first.message
  result['received'] = [m0, m1].map { |m| OtherClient.describe(m) }

  conn.begin('tx1')
  conn.publish(dest, 't1', 'transaction' => 'tx1', 'persistent' => 'true')
  conn.ack(m0.headers['ack'], 'transaction' => 'tx1')
  first.with_receipt { |h| conn.commit('tx1', h) }

  conn.begin('tx2')
  conn.publish(dest, 't2', 'transaction' => 'tx2', 'persistent' => 'true')
  conn.ack(m1.headers['ack'], 'transaction' => 'tx2')
  first.with_receipt { |h| conn.abort('tx2', h) }

  first.with_receipt { |h| conn.publish(dest, 'end1', h) }
  result['after'] = first.until_marker('end1', ack: true).map { |m| OtherClient.describe(m) }
  first.close

  second = OtherClient::Session.new(opts, result)
  second.with_receipt('id' => 's2', 'ack' => 'auto') { |h| second.conn.subscribe(dest, h) }
  second.with_receipt { |h| second.conn.publish(dest, 'end2', h) }
  result['left'] = second.until_marker('end2').map { |m| OtherClient.describe(m) }
  second.close
end
