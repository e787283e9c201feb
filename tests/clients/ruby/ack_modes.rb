# Send and receive in one ack mode (--ack auto|client|client-individual), then see what the
# broker still holds.
#
# Session 1: SEND m0..m3 (receipt on the last), SUBSCRIBE with --ack, take the 4 MESSAGEs,
# acknowledge per mode (client: ACK m1, cumulative; client-individual: ACK m0 and m2; auto:
# nothing), DISCONNECT with a receipt. Session 2: SUBSCRIBE ack auto, SEND the marker
# "end", take every MESSAGE up to the marker: what session 1 left unacknowledged.
# Result: {"received": [...], "left": [...]}, each {"body", "headers"}.

require_relative 'common'

opts = OtherClient.options(ack: 'auto')
OtherClient.run('ack', opts[:timeout]) do |result|
  first = OtherClient::Session.new(opts, result)
  4.times do |i|
    headers = { 'x-seq' => i.to_s, 'persistent' => 'true' }
    if i == 3
      first.with_receipt(headers) { |h| first.conn.publish(opts[:dest], "m#{i}", h) }
    else
      first.conn.publish(opts[:dest], "m#{i}", headers)
    end
  end
  first.with_receipt('id' => 's1', 'ack' => opts[:ack]) { |h| first.conn.subscribe(opts[:dest], h) }
  received = Array.new(4) { first.message }
  result['received'] = received.map { |m| OtherClient.describe(m) }
  case opts[:ack]
  when 'client' then first.conn.ack(received[1].headers['ack'])
  when 'client-individual'
    first.conn.ack(received[0].headers['ack'])
    first.conn.ack(received[2].headers['ack'])
  end
  first.close

  second = OtherClient::Session.new(opts, result)
  second.with_receipt('id' => 's2', 'ack' => 'auto') { |h| second.conn.subscribe(opts[:dest], h) }
  second.with_receipt { |h| second.conn.publish(opts[:dest], 'end', h) }
  result['left'] = second.until_marker('end').map { |m| OtherClient.describe(m) }
  second.close
end
